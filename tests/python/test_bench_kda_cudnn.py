"""bench/bench_kda.py's cudnn arm on the CPU, with a stand-in for cuDNN's kimi_delta_attention:
how FLA's layout maps onto cuDNN's, and which ops the arm skips when the engine refuses its
backward (grouped value heads)."""

import functools

import pytest
import torch

from conftest import import_bench

bench_kda = import_bench("bench_kda")


def toy_fla(q, k, v, g, beta, cu_seqlens=None):
    """A differentiable stand-in for chunk_kda in FLA's layout (not KDA: only the plumbing
    matters here), in either layout (heads second to last); value head hv reads q/k head
    hv // (HV // H)."""
    rep = v.shape[-2] // q.shape[-2]
    qk = (q.repeat_interleave(rep, -2) * k.repeat_interleave(rep, -2) * g.exp()).sum(-1)
    return (v * (qk * beta)[..., None]).to(v.dtype), None


class Refused(NotImplementedError):
    pass


def fake_cudnn(calls, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None,
               output_final_state=False, plan_name=None):
    """cuDNN's kimi_delta_attention in its token-packed layout: the toy above, with a backward
    that raises for grouped value heads, as the Hopper engine's does."""
    calls.append(dict(shapes=[tuple(t.shape) for t in (q, k, v, g, beta)],
                      dtypes=[t.dtype for t in (q, k, v, g, beta, cu_seqlens)], scale=scale,
                      plan_name=plan_name, initial_state=initial_state, cu=cu_seqlens.tolist()))
    grouped = v.shape[1] != q.shape[1]

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta):
            ctx.save_for_backward(q, k, v, g, beta)
            return toy_fla(q, k, v, g, beta)[0]

        @staticmethod
        def backward(ctx, do):
            calls.append("backward")
            if grouped:
                raise Refused("the backward kernel needs equal head counts")
            x = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            with torch.enable_grad():
                return torch.autograd.grad(toy_fla(*x)[0], x, do)

    N, HV, V, K = len(cu_seqlens) - 1, v.shape[1], v.shape[2], q.shape[2]
    ht = torch.arange(N * HV * V * K, dtype=torch.float32).reshape(N, HV, V, K)
    return Op.apply(q, k, v, g, beta), ht


def inputs(H, HV, T=24, K=8, V=8, B=1):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=gen).bfloat16()
    k = torch.randn(B, T, H, K, generator=gen).bfloat16()
    v = torch.randn(B, T, HV, V, generator=gen).bfloat16()
    g = -torch.rand(B, T, HV, K, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen).bfloat16()
    return [t.requires_grad_() for t in (q, k, v, g, beta)]


def test_layout_mapping():
    calls = []
    arm = functools.partial(bench_kda.cudnn_chunk_kda, functools.partial(fake_cudnn, calls))
    q, k, v, g, beta = inputs(2, 4)
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    o, ht = arm(q, k, v, g, beta, cu_seqlens=cu)
    call = calls[-1]
    assert call["shapes"] == [(24, 2, 8), (24, 2, 8), (24, 4, 8), (24, 4, 8), (24, 4)]
    assert call["dtypes"] == [torch.bfloat16] * 3 + [torch.float32] * 2 + [torch.int32]
    assert call["plan_name"] == "kda_hopper_cuda" and call["scale"] is None
    assert call["cu"] == [0, 10, 24] and ht is None
    torch.testing.assert_close(o, toy_fla(q, k, v, g, beta.float())[0])

    # B sequences without cu_seqlens; FLA's K-major state in and out, cuDNN's V-major inside.
    q, k, v, g, beta = inputs(2, 2, B=3)
    h0 = torch.randn(3, 2, 8, 8)
    o, ht = arm(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert calls[-1]["cu"] == [0, 24, 48, 72] and o.shape == (3, 24, 2, 8)
    torch.testing.assert_close(calls[-1]["initial_state"], h0.transpose(-1, -2))
    assert ht[0, 0, 1, 0] == 1  # cuDNN's [n, h, v=0, k=1] is FLA's [n, h, k=1, v=0]
    with pytest.raises(ValueError):
        arm(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 72], dtype=torch.int32))


@pytest.mark.parametrize("H, HV", [(2, 2), (2, 4)])
def test_check_cudnn(H, HV):
    calls = []
    arms = {"cake": (toy_fla, "toy"),
            "cudnn": (functools.partial(bench_kda.cudnn_chunk_kda,
                                        functools.partial(fake_cudnn, calls)), "fake")}
    leaves = inputs(H, HV)
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    do = torch.randn(1, 24, HV, 8).bfloat16()
    ops = ["fwd", "fwd+bwd", "ckpt"]
    refused, agreement = bench_kda.check_cudnn(arms, leaves, cu, do, ops)
    assert all(t.grad is None for t in leaves)
    if H == HV:
        assert refused == {}
        assert set(agreement["cake"]) == {"o", "dq", "dk", "dv", "dg", "dbeta"}
    else:
        # the backward tried once; both ops with a backward skipped with its reason
        assert calls.count("backward") == 1
        assert set(refused) == {"fwd+bwd", "ckpt"}
        assert refused["ckpt"] == "Refused: the backward kernel needs equal head counts"
        assert set(agreement["cake"]) == {"o"}
    # the toy in both arms; beta is fp32 in one and bf16 in the other
    assert max(agreement["cake"].values()) < 1e-2


def test_rel_rms():
    ref = torch.ones(1000)
    assert bench_kda.rel_rms(ref, ref) == 0
    assert bench_kda.rel_rms(ref * 1.01, ref) == pytest.approx(1e-2, rel=1e-4)


def test_each_baseline_is_compared_with_cake():
    """agreement_with_cake: a baseline computing the same as cake agrees (0), one off by 1 % is
    reported so, a failing one is "not compared" without ending the run, cudnn is left to its own
    check."""
    gen = torch.Generator().manual_seed(3)
    T, H, HV, D = 20, 1, 2, 4
    leaves = [torch.randn(1, T, H, D, generator=gen), torch.randn(1, T, H, D, generator=gen),
              torch.randn(1, T, HV, D, generator=gen), -torch.rand(1, T, HV, D, generator=gen),
              torch.rand(1, T, HV, generator=gen)]
    leaves = [t.double().requires_grad_() for t in leaves]
    cu = torch.tensor([0, 7, T], dtype=torch.int32)
    do = torch.randn(1, T, HV, D, generator=gen).double()

    def off(*args, **kw):
        o, s = toy_fla(*args, **kw)
        return 1.01 * o, s

    def failing(*args, **kw):
        raise RuntimeError("refused")

    arms = {"cake": (toy_fla, "0"), "twin": (toy_fla, "0"), "off": (off, "0"),
            "broken": (failing, "0"), "cudnn": (failing, "0"), "cake_control": (toy_fla, "0")}
    got = bench_kda.agreement_with_cake(arms, leaves, cu, do, True, {})
    assert set(got) == {"twin", "off", "broken"}
    assert set(got["twin"]) == {"o", "dq", "dk", "dv", "dg", "dbeta"}
    assert all(e == 0 for e in got["twin"].values())
    assert got["off"]["o"] == pytest.approx(0.01) and got["off"]["dv"] == pytest.approx(0.01)
    assert got["broken"].startswith("not compared: RuntimeError: refused")
    assert all(t.grad is None for t in leaves)
