"""cake.rms_norm_gated on CPU tensors (the FP64 reference through the C ABI) against a plain-torch
float64 formula, gradients through both autograds, gradcheck, torch.compile, and the validation
errors."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import cake

ACTS = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


def torch_norm(x, g, weight, eps, activation):
    """x / sqrt(mean(x^2) + eps) * weight * act(g), in plain torch."""
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    return y if g is None else y * ACTS[activation](g)


def make(seed, shape, *, gate=True, weight=True, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    t = dict(x=randn(*shape), g=randn(*shape) if gate else None,
             weight=randn(shape[-1]) if weight else None)
    for v in t.values():
        if v is not None:
            v.requires_grad_()
    return t


@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("weight", [False, True])
def test_matches_torch_formula(activation, gate, weight):
    t = make(1, (2, 3, 5, 12), gate=gate, weight=weight)
    y = cake.rms_norm_gated(**t, eps=1e-3, activation=activation)
    ref = torch_norm(**t, eps=1e-3, activation=activation)
    torch.testing.assert_close(y, ref, rtol=1e-13, atol=1e-13)
    gen = torch.Generator().manual_seed(2)
    r = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    inputs = [v for v in t.values() if v is not None]
    for got, want in zip(torch.autograd.grad((y * r).sum(), inputs),
                         torch.autograd.grad((ref * r).sum(), inputs)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gradcheck(activation):
    t = make(3, (4, 6))
    inputs = (t["x"], t["g"], t["weight"])
    assert torch.autograd.gradcheck(
        lambda x, g, w: cake.rms_norm_gated(x, g, w, 1e-5, activation), inputs)


def test_gradcheck_without_gate_or_weight():
    x = make(4, (3, 8))["x"]
    assert torch.autograd.gradcheck(lambda x: cake.rms_norm_gated(x), (x,))



def test_sigmoid_slope_where_the_sigmoid_rounds_to_one():
    """dg of the sigmoid gate where sigmoid(g) rounds to 1 in double (g above ~37) but its slope
    e^-|g| / (1 + e^-|g|)^2 does not vanish: a slope taken as s (1 - s) would give 0 there."""
    g = torch.tensor([[20.0, 40.0, 100.0, 700.0, -40.0, -700.0]], dtype=torch.float64,
                     requires_grad=True)
    x = torch.ones(1, 6, dtype=torch.float64)
    (dg,) = torch.autograd.grad(cake.rms_norm_gated(x, g, None, 1e-5, "sigmoid").sum(), g)
    e = torch.exp(-g.detach().abs())
    n = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(dg, n * e / (1 + e) ** 2, rtol=1e-12, atol=0)


def test_zero_row_and_dtypes():
    x = torch.zeros(2, 8)
    x[1] = torch.arange(8.0)
    y = cake.rms_norm_gated(x.to(torch.bfloat16), weight=torch.ones(8))
    assert y.dtype == torch.bfloat16 and torch.equal(y[0], torch.zeros(8, dtype=torch.bfloat16))


def test_gate_is_cast_to_x_dtype():
    t = make(5, (3, 16), dtype=torch.bfloat16)
    g32 = t["g"].detach().float().requires_grad_()
    y = cake.rms_norm_gated(t["x"], g32, t["weight"])
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, cake.rms_norm_gated(t["x"], t["g"], t["weight"]))
    y.sum().backward()
    assert g32.grad.dtype == torch.float32


def test_more_than_five_dims():
    t = make(6, (2, 1, 2, 1, 3, 8))
    y = cake.rms_norm_gated(**t)
    torch.testing.assert_close(y, torch_norm(**t, eps=1e-5, activation="swish"), rtol=1e-13,
                               atol=1e-13)


def test_cpu_warns_where_cuda_would_refuse():
    t = make(7, (2, 12), dtype=torch.float32)
    with pytest.warns(cake.CudaSupportWarning, match=r"N a multiple of 8"):
        cake.rms_norm_gated(**t)
    t = make(7, (2, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cake.rms_norm_gated(**t)


@pytest.mark.parametrize("gated, weighted", [(True, True), (False, True), (True, False),
                                             (False, False)])
def test_opcheck(gated, weighted):
    """Both custom ops (the forward and the backward) against their fake kernels and autograd
    registrations, with and without g and weight."""
    t = make(8, (3, 8))
    g = t["g"] if gated else None
    weight = t["weight"] if weighted else None
    torch.library.opcheck(torch.ops.cake.rms_norm_gated_forward.default,
                          (t["x"], g, weight, 1e-5, 2))
    _, rstd = torch.ops.cake.rms_norm_gated_forward(t["x"].detach(), g, weight, 1e-5, 2)
    dy = torch.randn_like(t["x"]).detach()
    torch.library.opcheck(
        torch.ops.cake.rms_norm_gated_backward.default,
        (t["x"].detach(), None if g is None else g.detach(),
         None if weight is None else weight.detach(), rstd, dy, 2),
        test_utils=("test_schema", "test_faketensor"))  # its own gradient: first order only


def test_torch_compile_fullgraph():
    t = make(9, (2, 4, 8))
    f = torch.compile(lambda x, g, w: cake.rms_norm_gated(x, g, w, 1e-5, "sigmoid"),
                      fullgraph=True, backend="eager")
    y = f(t["x"], t["g"], t["weight"])
    torch.testing.assert_close(y, cake.rms_norm_gated(**t, activation="sigmoid"), rtol=0, atol=0)
    y.sum().backward()
    assert t["weight"].grad is not None


def _valid(**changes):
    args = dict(x=torch.randn(2, 3, 8, dtype=torch.float64),
                g=torch.randn(2, 3, 8, dtype=torch.float64),
                weight=torch.randn(8, dtype=torch.float64), eps=1e-5, activation="swish")
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, pattern", [
    (dict(weight=torch.randn(7, dtype=torch.float64)),
     r"^weight must have shape \[N\] = \[8\], got \[7\]"),
    (dict(g=torch.randn(2, 3, 9, dtype=torch.float64)),
     r"^g must have shape x's = \[2, 3, 8\], got \[2, 3, 9\]"),
    (dict(x=torch.zeros(2, 3, 8, dtype=torch.int32), g=None),
     r"^x must be a float tensor .* got int32"),
    (dict(eps=float("nan")), r"^eps must be finite and >= 0, got nan"),
    (dict(activation="relu"), r"^activation must be one of .*, got 'relu'"),
    (dict(weight=torch.randn(8, device="meta")), r"^weight must be on x's device"),
])
def test_validation_errors(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        cake.rms_norm_gated(**_valid(**changes))
