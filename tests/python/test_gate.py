"""cake/gate.py (the in-op gate and beta's sigmoid computed in torch for cake.kcp on CUDA) against
the FP64 reference's own in-op forms, on CPU tensors in float64: o, the final state and every
gradient (dA_log, ddt_bias, and those of the raw g and beta) agree to 1e-10 of their largest
element; and its shape checks name the argument."""

import pytest
import torch

import cake
from cake import gate
from conftest import assert_rel
from cake.options import GATED_DELTA_RULE, KDA_OP, parse

F64 = torch.float64


def case(kda, seed):
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, K, V = 70, 1, 2, 8, 8
    return dict(q=torch.randn(1, T, H, K, generator=gen, dtype=F64),
                k=torch.randn(1, T, H, K, generator=gen, dtype=F64),
                v=torch.randn(1, T, HV, V, generator=gen, dtype=F64),
                g=torch.randn((1, T, HV, K) if kda else (1, T, HV), generator=gen, dtype=F64),
                beta=torch.randn(1, T, HV, generator=gen, dtype=F64),
                A_log=torch.rand(HV, generator=gen, dtype=F64),
                dt_bias=torch.randn(HV * K if kda else HV, generator=gen, dtype=F64))


def run(kda, t, options, in_torch):
    leaves = {n: x.clone().requires_grad_() for n, x in t.items()}
    op = KDA_OP if kda else GATED_DELTA_RULE
    opts, A_log, dt_bias, errors = parse(op, num_v_heads=t["v"].shape[2],
                                         head_dim_k=t["q"].shape[3], A_log=leaves["A_log"],
                                         dt_bias=leaves["dt_bias"], **options)
    assert not errors
    g, beta = leaves["g"], leaves["beta"]
    kwargs = dict(options)
    if in_torch:
        _, g, beta, _, _ = gate.in_torch(opts, leaves["q"], leaves["v"], g, beta, A_log, dt_bias)
        kwargs = {n: x for n, x in options.items()
                  if n not in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                               "allow_neg_eigval", "lower_bound")}
    else:
        kwargs.update(A_log=leaves["A_log"], dt_bias=leaves["dt_bias"])
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    o, _ = fn(leaves["q"], leaves["k"], leaves["v"], g, beta, **kwargs)
    o.square().sum().backward()
    return [o.detach()] + [leaves[n].grad for n in ("q", "k", "v", "g", "beta", "A_log",
                                                     "dt_bias")]


OPTIONS = {
    "gate": dict(use_gate_in_kernel=True),
    "gate_sigmoid_neg": dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                             allow_neg_eigval=True),
    "sigmoid": dict(use_beta_sigmoid_in_kernel=True),
    "lower_bound": dict(use_gate_in_kernel=True, lower_bound=-2.0),
}
# Every (variant, options) pair but GDN's lower_bound, which is KDA's alone (GDN refuses it:
# test_validation.py).
GATE_CASES = [pytest.param(kda, options, id=f"{'kda' if kda else 'gdn'}-{name}")
              for name, options in OPTIONS.items() for kda in (False, True)
              if kda or "lower_bound" not in options]


@pytest.mark.parametrize("kda, options", GATE_CASES)
def test_in_torch_equals_the_reference_in_op(kda, options):
    t = case(kda, 3)
    want = run(kda, t, options, in_torch=False)
    got = run(kda, t, options, in_torch=True)
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"), got, want):
        if b is None:
            assert a is None or not a.any(), name
            continue
        assert_rel(a, b, 1e-10, name)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_shapes_are_checked_before_broadcasting(kda):
    t = case(kda, 4)
    op = KDA_OP if kda else GATED_DELTA_RULE
    opts, A_log, dt_bias, _ = parse(op, use_gate_in_kernel=True, num_v_heads=2, head_dim_k=8,
                                    A_log=t["A_log"], dt_bias=t["dt_bias"])
    wrong_g = t["g"][..., :1] if kda else t["g"][:, :, :1]  # would broadcast against dt_bias
    with pytest.raises(ValueError, match=r"^g must have shape"):
        gate.in_torch(opts, t["q"], t["v"], wrong_g, t["beta"], A_log, dt_bias)
    with pytest.raises(ValueError, match=r"^A_log must have shape \[HV\] = \[2\], got \[3\]"):
        gate.in_torch(opts, t["q"], t["v"], t["g"], t["beta"], torch.zeros(3, dtype=F64),
                      dt_bias)
    with pytest.raises(ValueError, match=r"^dt_bias must have shape"):
        gate.in_torch(opts, t["q"], t["v"], t["g"], t["beta"], A_log, torch.zeros(5, dtype=F64))


@pytest.mark.parametrize("kda, lower_bound", [(False, None), (True, None), (True, -3.0)],
                         ids=["gdn-softplus", "kda-softplus", "kda-lower_bound"])
def test_gate_backward_by_finite_differences(kda, lower_bound):
    """The gate's hand-written backward (d raw, dA_log summed over tokens and channels, ddt_bias
    over tokens) against torch's finite differences in float64 (lower_bound is KDA's alone)."""
    HV, K = 2, 3
    gen = torch.Generator().manual_seed(7)
    raw = torch.randn((2, 5, HV, K) if kda else (2, 5, HV), generator=gen, dtype=F64)
    A_log = torch.rand(HV, generator=gen, dtype=F64)
    dt_bias = torch.randn(HV * K if kda else HV, generator=gen, dtype=F64)
    shapes = ((HV, 1), (HV, K)) if kda else ((HV,), (HV,))
    inputs = [x.requires_grad_() for x in (raw, A_log, dt_bias)]
    assert torch.autograd.gradcheck(
        lambda r, a, b: gate._Gate.apply(r, a, b, lower_bound, *shapes), inputs)



@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_lower_bound_slope_where_the_sigmoid_rounds_to_one(dtype):
    """d raw of lower_bound sigmoid(raw) where the sigmoid rounds to 1 (raw above ~17 in float32,
    ~37 in double) but its slope e^-raw / (1 + e^-raw)^2 does not vanish."""
    raw = torch.tensor([20.0, 40.0, 80.0, -40.0], dtype=dtype).view(1, 1, 1, 4).requires_grad_()
    g = gate._Gate.apply(raw, None, None, -3.0, (1, 1), (1, 4))
    (d_raw,) = torch.autograd.grad(g.sum(), raw)
    e = torch.exp(-raw.detach().double().abs())
    torch.testing.assert_close(d_raw.double(), -3.0 * e / (1 + e) ** 2, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("neg", [False, True])
def test_beta_slope_where_the_sigmoid_rounds_to_one(dtype, neg):
    """d beta_raw of beta = c sigmoid(beta_raw) in torch (the route of cake.kcp on CUDA) where
    the sigmoid rounds to 1 but its slope c e^-x / (1 + e^-x)^2 does not vanish."""
    t = case(True, 5)
    opts, A_log, dt_bias, _ = parse(KDA_OP, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg,
                                    num_v_heads=2, head_dim_k=8)
    pattern = torch.tensor([20.0, 40.0, 80.0, -40.0, 0.0], dtype=dtype).repeat(14)  # T = 70
    raw = pattern.view(1, 70, 1).expand(1, 70, 2).contiguous().requires_grad_()
    _, _, beta, _, _ = gate.in_torch(opts, t["q"], t["v"], t["g"], raw, A_log, dt_bias)
    (d_raw,) = torch.autograd.grad(beta.sum(), raw)
    e = torch.exp(-raw.detach().double().abs())
    c = 2.0 if neg else 1.0
    torch.testing.assert_close(d_raw.double(), c * e / (1 + e) ** 2, rtol=1e-5, atol=0)
    assert beta.dtype == torch.promote_types(dtype, torch.float32)


def test_gate_keeps_only_its_inputs_for_the_backward():
    """Autograd holds no float32 intermediate of g's size for the gate: only the raw gate,
    A_log and dt_bias (the backward recomputes the rest)."""
    t = case(True, 5)
    opts, A_log, dt_bias, _ = parse(KDA_OP, use_gate_in_kernel=True, num_v_heads=2, head_dim_k=8,
                                    A_log=t["A_log"], dt_bias=t["dt_bias"])
    raw = t["g"].float().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        _, g, _, _, _ = gate.in_torch(opts, t["q"], t["v"], raw, t["beta"], A_log, dt_bias)
    assert g.shape == raw.shape
    assert {x.data_ptr() for x in saved} <= {raw.data_ptr(), A_log.data_ptr(),
                                              dt_bias.data_ptr()}, [tuple(x.shape) for x in saved]
