"""cake.causal_conv1d on CPU tensors (the FP64 reference through the C ABI) against a plain-torch
float64 composition (F.conv1d per document on the document's tokens behind its initial state),
gradients through both autograds, gradcheck, and every validation error."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import cake
from conftest import record_argument

ADVERSARIAL = (1, 2, 3, 4, 5)


def torch_conv(x, weight, bias, residual, initial_state, cu_seqlens, activation):
    """(y [B, T, D], final_state [N, D, W]) in plain torch: x [B, T, D], one document per row or
    per cu_seqlens span."""
    B, T, D = x.shape
    W = weight.shape[1]
    flat = x.reshape(B * T, D)
    cu = cu_seqlens.tolist() if cu_seqlens is not None else [b * T for b in range(B + 1)]
    ys, states = [], []
    for n in range(len(cu) - 1):
        doc = flat[cu[n]:cu[n + 1]].T                                   # [D, L]
        front = initial_state[n] if initial_state is not None else doc.new_zeros(D, W)
        ext = torch.cat([front, doc], dim=1)                            # [D, W + L]: e[-W:L]
        L = doc.shape[1]
        if L:
            pre = F.conv1d(ext[None, :, 1:], weight[:, None, :], bias, groups=D)[0]  # [D, L]
            ys.append(F.silu(pre) if activation in ("silu", "swish") else pre)
        states.append(ext[:, L:L + W])
    y = torch.cat(ys, dim=1).T.reshape(B, T, D)
    if residual is not None:
        y = y + residual
    return y, torch.stack(states)


def make(seed, lengths, D, W, *, bias=True, residual=True, initial_state=True, B=None,
         dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    if B is None:
        T, cu, N, B = sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0)]), \
            len(lengths), 1
    else:
        T, cu, N = lengths[0], None, B
    t = dict(x=randn(B, T, D), weight=randn(D, W), bias=randn(D) if bias else None,
             residual=randn(B, T, D) if residual else None,
             initial_state=randn(N, D, W) if initial_state else None)
    for v in t.values():
        if v is not None:
            v.requires_grad_()
    return t, cu


def grads(tensors, outputs, seed):
    """Gradients of a random linear loss of the outputs, for every tensor input."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outputs)
    inputs = [v for v in tensors.values() if v is not None]
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("W", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("extras", [False, True])
def test_matches_torch_composition(W, activation, extras):
    lengths = [*ADVERSARIAL, max(W - 1, 1), W, W + 1, 17]
    t, cu = make(W, lengths, 5, W, bias=extras, residual=extras, initial_state=extras)
    y, ht = cake.causal_conv1d(**t, output_final_state=True, activation=activation,
                               cu_seqlens=cu)
    y_ref, ht_ref = torch_conv(**t, cu_seqlens=cu, activation=activation)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ht, ht_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads(t, (y, ht), 3), grads(t, (y_ref, ht_ref), 3)):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_batch_rows_without_cu_seqlens():
    t, _ = make(1, [7], 4, 4, B=3)
    y, ht = cake.causal_conv1d(**t, output_final_state=True, activation="silu")
    y_ref, ht_ref = torch_conv(**t, cu_seqlens=None, activation="silu")
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ht, ht_ref, rtol=0, atol=0)


def test_empty_documents_pass_the_state_through():
    t, cu = make(2, [3, 0, 0, 2], 3, 4)
    y, ht = cake.causal_conv1d(**t, output_final_state=True, cu_seqlens=cu)
    torch.testing.assert_close(ht[1], t["initial_state"][1], rtol=0, atol=0)
    y_ref, ht_ref = torch_conv(**t, cu_seqlens=cu, activation=None)
    for g, g_ref in zip(grads(t, (y, ht), 5), grads(t, (y_ref, ht_ref), 5)):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_unused_final_state_gets_no_zero_gradient(monkeypatch):
    # Autograd hands the backward None for an unused final state, not zeros it would allocate and
    # fill (and the kernel read) every call; the gradients stay torch's.
    dhts = record_argument(monkeypatch, cake.conv1d, "_backward", 6)
    t, cu = make(6, [3, 5], 3, 4)
    y, _ = cake.causal_conv1d(**t, output_final_state=True, activation="silu", cu_seqlens=cu)
    y_ref, _ = torch_conv(**t, cu_seqlens=cu, activation="silu")
    for g, g_ref in zip(grads(t, (y,), 7), grads(t, (y_ref,), 7)):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    assert dhts == [None]


@pytest.mark.parametrize("W", [2, 4])
def test_gradcheck(W):
    t, cu = make(11, [1, W - 1, W + 2], 3, W)
    inputs = tuple(t.values())

    def f(x, weight, bias, residual, initial_state):
        return cake.causal_conv1d(x, weight, bias, residual, initial_state, True, "silu", None, cu)

    assert torch.autograd.gradcheck(f, inputs)


def test_outputs_in_input_dtypes():
    t, cu = make(4, [3, 5], 8, 4, dtype=torch.float32)
    t["weight"] = t["weight"].detach().to(torch.bfloat16).requires_grad_()
    y, ht = cake.causal_conv1d(**t, output_final_state=True, cu_seqlens=cu)
    assert y.dtype == ht.dtype == torch.float32
    dx, dw, *_ = grads(t, (y,), 1)
    assert dx.dtype == torch.float32 and dw.dtype == torch.bfloat16


def test_trailing_dims_are_flattened_as_fla_does():
    t, cu = make(5, [4, 6], 6, 3, residual=False)
    x4 = t["x"].detach().reshape(1, 10, 2, 3).requires_grad_()
    y4, _ = cake.causal_conv1d(x4, t["weight"], cu_seqlens=cu)
    y3, _ = cake.causal_conv1d(t["x"], t["weight"], cu_seqlens=cu)
    assert y4.shape == x4.shape
    torch.testing.assert_close(y4.reshape(1, 10, 6), y3, rtol=0, atol=0)


def test_residual_of_xs_trailing_dims_is_flattened_with_x():
    # a residual in x's [B, T, ...] shape is added token by token, as with [B, T, D]
    t, cu = make(5, [4, 6], 6, 3)
    x4 = t["x"].detach().reshape(1, 10, 2, 3)
    residual4 = t["residual"].detach().reshape(1, 10, 2, 3)
    y4, _ = cake.causal_conv1d(x4, t["weight"], residual=residual4, cu_seqlens=cu)
    y3, _ = cake.causal_conv1d(t["x"], t["weight"], residual=t["residual"], cu_seqlens=cu)
    assert y4.shape == x4.shape
    torch.testing.assert_close(y4.reshape(1, 10, 6), y3, rtol=0, atol=0)


def test_no_final_state_unless_asked():
    t, cu = make(9, [3, 5], 4, 4)
    assert cake.causal_conv1d(t["x"], t["weight"], cu_seqlens=cu)[1] is None
    assert cake.causal_conv1d(**t, cu_seqlens=cu, output_final_state=False)[1] is None


def test_cpu_warns_where_cuda_would_refuse():
    t, cu = make(6, [4], 4, 5, dtype=torch.float32)
    with pytest.warns(cake.CudaSupportWarning, match=r"widths W = 2..4"):
        cake.causal_conv1d(**t, cu_seqlens=cu)
    # float64 (gradcheck's dtype) is the reference's own: no warning, whatever CUDA would say
    t, cu = make(6, [4], 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cake.causal_conv1d(**t, cu_seqlens=cu)


def test_opcheck():
    t, cu = make(7, [2, 5], 4, 4)
    args = (*t.values(), cu, 1, True)
    torch.library.opcheck(torch.ops.cake.conv1d_forward.default, args)


def test_torch_compile_fullgraph():
    t, cu = make(8, [2, 5], 4, 4)
    f = torch.compile(lambda x, w: cake.causal_conv1d(x, w, activation="silu",
                                                      cu_seqlens=cu)[0], fullgraph=True,
                      backend="eager")
    torch.testing.assert_close(f(t["x"], t["weight"]),
                               cake.causal_conv1d(t["x"], t["weight"], activation="silu",
                                                  cu_seqlens=cu)[0], rtol=0, atol=0)


def _valid(**changes):
    x = torch.randn(1, 6, 4, dtype=torch.float64)
    args = dict(x=x, weight=torch.randn(4, 3, dtype=torch.float64),
                bias=torch.randn(4, dtype=torch.float64), residual=torch.randn_like(x),
                initial_state=torch.randn(2, 4, 3, dtype=torch.float64),
                output_final_state=True, activation="silu", cu_seqlens=torch.tensor([0, 2, 6]))
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, pattern", [
    (dict(x=torch.randn(6, 4)), r"^x must have 3 dimensions \[B, T, D\], got shape \[6, 4\]"),
    (dict(x=torch.zeros(1, 6, 4, dtype=torch.int32)), r"^x must be a float tensor"),
    (dict(weight=torch.randn(5, 3)), r"^weight must have shape \[D, W\] with D = 4"),
    (dict(weight=torch.randn(4, 0)), r"^weight must have shape \[D, W\] .* W >= 1"),
    (dict(weight=torch.randn(4)), r"^weight must have shape \[D, W\]"),
    (dict(bias=torch.randn(3)), r"^bias must have shape \[D\] = \[4\], got \[3\]"),
    (dict(residual=torch.randn(1, 5, 4)), r"^residual must have shape \[B, T, D\] .*= \[1, 6, 4\]"),
    (dict(initial_state=torch.randn(2, 4, 4)),
     r"^initial_state must have shape \[N, D, W\] = \[2, 4, 3\], got \[2, 4, 4\]"),
    (dict(initial_state=torch.randn(3, 4, 3)), r"^initial_state must have shape \[N, D, W\]"),
    (dict(cu_seqlens=torch.tensor([0.0, 2.0, 6.0])), r"^cu_seqlens must be int32 or int64"),
    (dict(cu_seqlens=torch.tensor([0, 2, 7])), r"^cu_seqlens must end at the number of tokens T = 6"),
    (dict(cu_seqlens=torch.tensor([1, 2, 6])), r"^cu_seqlens must start at 0, got 1"),
    (dict(cu_seqlens=torch.tensor([0, 4, 2])), r"^cu_seqlens must be non-decreasing"),
    (dict(x=torch.randn(2, 3, 4), residual=None, initial_state=None),
     r"^the batch size B must be 1 when cu_seqlens is given"),
    (dict(activation="relu"), r"^activation must be None, 'silu' or 'swish', got 'relu'"),
    (dict(backend="jax"), r"^backend must be None, 'triton', 'cuda' or 'mix'"),
    (dict(weight=torch.randn(4, 3, device="meta")), r"^weight must be on x's device"),
])
def test_validation_errors(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        cake.causal_conv1d(**_valid(**changes))


def test_cp_context_points_to_kcp():
    with pytest.raises(NotImplementedError, match=r"cake.kcp.causal_conv1d_kcp"):
        cake.causal_conv1d(**_valid(), cp_context=object())


def test_valid_call_runs():
    y, ht = cake.causal_conv1d(**_valid())
    assert y.shape == (1, 6, 4) and ht.shape == (2, 4, 3)
