"""cake/gate.py (the in-op gate and beta's sigmoid computed in torch for the CUDA kernels) against
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


@pytest.mark.parametrize("options", [
    dict(use_gate_in_kernel=True),
    dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    dict(use_beta_sigmoid_in_kernel=True),
    dict(use_gate_in_kernel=True, lower_bound=-2.0),
], ids=["gate", "gate_sigmoid_neg", "sigmoid", "lower_bound"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_in_torch_equals_the_reference_in_op(kda, options):
    if "lower_bound" in options and not kda:
        pytest.skip("lower_bound is KDA's")
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
