"""cake.kcp.causal_conv1d_kcp on the CPU with virtual ranks: the context-parallel conv equals the
single-rank cake.causal_conv1d in FP64 (y and every gradient, to 1e-12) for conv widths 1..8,
every layout, world sizes 1..8 and random packs with documents shorter than the width (halos that
reach back over several ranks); the bytes moved equal ctx.exchange_bytes; calls that differ
between ranks raise ValueError on every rank without hanging."""

import random

import pytest
import torch

import cake
import cake.kcp as kcp
from test_kcp import CountingExchange

TOL = 1e-12
TIMEOUT = 60.0
D = 3


def random_pack(seed, num_docs, longest):
    rng = random.Random(seed)
    lengths = [rng.choice([0, 1, 2, 3, rng.randint(1, longest)]) for _ in range(num_docs)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    if cu[-1] == 0:
        cu[-1] = 1
    return cu


def make(seed, cu, width, extras):
    gen = torch.Generator().manual_seed(seed)
    T = cu[-1]
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return dict(x=randn(1, T, D), weight=randn(D, width), bias=randn(D) if extras else None,
                residual=randn(1, T, D) if extras else None)


def single_rank(t, cu, activation, dy):
    leaves = {n: v.clone().requires_grad_() for n, v in t.items() if v is not None}
    y, _ = cake.causal_conv1d(leaves["x"], leaves["weight"], leaves.get("bias"),
                              leaves.get("residual"), activation=activation,
                              cu_seqlens=torch.tensor(cu))
    y.backward(dy)
    return y.detach(), {n: v.grad for n, v in leaves.items()}


def context_parallel(t, cu, activation, dy, world, layout):
    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout=layout)
        x = kcp.shard(t["x"], ctx).requires_grad_()
        r = kcp.shard(t["residual"], ctx).requires_grad_() if t["residual"] is not None else None
        w = t["weight"].clone().requires_grad_()
        b = t["bias"].clone().requires_grad_() if t["bias"] is not None else None
        y, none = kcp.causal_conv1d_kcp(x, w, b, r, activation, ctx=ctx)
        assert none is None
        (y * kcp.shard(dy, ctx)).sum().backward()
        grads = {"x": kcp.unshard(x.grad, ctx), "weight": w.grad}
        if b is not None:
            grads["bias"] = b.grad
        if r is not None:
            grads["residual"] = kcp.unshard(r.grad, ctx)
        return kcp.unshard(y.detach(), ctx), grads

    return kcp.VirtualWorld(world, timeout=TIMEOUT).run(body)


def assert_close(got, want, what):
    err = (got - want).abs().max().item() if got.numel() else 0.0
    scale = max(want.abs().max().item() if want.numel() else 0.0, 1.0)
    assert err <= TOL * scale, f"{what}: max error {err}"


def _grid():
    cases = []
    for width in range(1, 9):
        for i, layout in enumerate(kcp.LAYOUTS):
            world = (1, 2, 3, 4, 8)[(width + i) % 5]
            cases.append((width, layout, world, width * 10 + i))
    return cases


@pytest.mark.parametrize("width,layout,world,seed", _grid())
def test_kcp_equals_single_rank(width, layout, world, seed):
    cu = random_pack(seed, num_docs=6, longest=3 * width + 5)
    activation = (None, "silu", "swish")[seed % 3]
    t = make(seed, cu, width, extras=seed % 2 == 0)
    dy = torch.randn(1, cu[-1], D, generator=torch.Generator().manual_seed(seed + 1),
                     dtype=torch.float64)
    y_ref, g_ref = single_rank(t, cu, activation, dy)
    ranks = context_parallel(t, cu, activation, dy, world, layout)
    for r, (y, grads) in enumerate(ranks):
        assert_close(y, y_ref, f"rank {r} y")
        assert_close(grads["x"], g_ref["x"], f"rank {r} dx")
        if "residual" in grads:
            assert_close(grads["residual"], g_ref["residual"], f"rank {r} dresidual")
    for name in ("weight", "bias"):
        if name in g_ref:  # partial sums per rank
            assert_close(sum(g[name] for _, g in ranks), g_ref[name], f"d{name}")


def test_halo_spans_several_ranks():
    # One document of 9 tokens over 8 ranks: at width 8 a rank's halo comes from up to 7 ranks.
    cu = [0, 9]
    t = make(1, cu, 8, extras=True)
    dy = torch.randn(1, 9, D, dtype=torch.float64)
    y_ref, g_ref = single_rank(t, cu, "silu", dy)
    for y, grads in context_parallel(t, cu, "silu", dy, 8, "contiguous"):
        assert_close(y, y_ref, "y")
        assert_close(grads["x"], g_ref["x"], "dx")


@pytest.mark.parametrize("width,world,layout", [(1, 3, "zigzag"), (4, 4, "zigzag_per_document"),
                                                (3, 2, "contiguous")])
def test_exchange_bytes_equal_bytes_gathered(width, world, layout):
    cu = [0, 5, 6, 40, 41, 90]
    t = make(3, cu, width, extras=False)

    def body(ex):
        counting = CountingExchange(ex)
        ctx = kcp.build_context(cu, exchange=counting, layout=layout)
        expected = ctx.exchange_bytes(conv_dim=D, conv_width=width, dtype=torch.float64)

        def step():
            counting.sent = counting.received = 0
            x = kcp.shard(t["x"], ctx).requires_grad_()
            y, _ = kcp.causal_conv1d_kcp(x, t["weight"], ctx=ctx)
            forward = (counting.sent, counting.received)
            y.sum().backward()
            return forward, (counting.sent - forward[0], counting.received - forward[1])

        first, (forward, backward) = step(), step()
        # The first call of these sizes on the exchange also agrees them: one more header.
        header = (expected.header_bytes, (world - 1) * expected.header_bytes)
        assert first == (tuple(a + b for a, b in zip(header, forward)), backward)
        return expected, forward, backward

    for expected, forward, backward in kcp.VirtualWorld(world, timeout=TIMEOUT).run(body):
        assert forward == (expected.forward_send, expected.forward_receive)
        assert backward == (expected.backward_send, expected.backward_receive)
        assert (expected.forward_slots > 0) == (width > 1 and world > 1)


def test_exchange_bytes_arguments():
    ctx = kcp.build_context([0, 10], world_size=2)
    with pytest.raises(ValueError, match="conv_dim and conv_width"):
        ctx.exchange_bytes(conv_dim=4)


@pytest.mark.parametrize("what", ["width", "activation", "context", "bias", "tokens"])
def test_mismatched_calls_raise_on_every_rank(what):
    cu = [0, 30, 64]

    def body(ex):
        other = ex.rank == 1
        # Two contexts of the pack, built by every rank (segments changes nothing of the conv's
        # halos but the context's fingerprint): rank 1 calls with the second.
        ctx = kcp.build_context(cu, exchange=ex)
        second = kcp.build_context(cu, exchange=ex, segments=2)
        if other and what == "context":
            ctx = second
        t = make(0, cu, 5 if other and what == "width" else 4, extras=False)
        x = kcp.shard(t["x"], ctx)
        if other and what == "tokens":
            x = x[:, 1:]
        bias = torch.zeros(D, dtype=torch.float64) if other and what == "bias" else None
        activation = "silu" if other and what == "activation" else None
        return kcp.causal_conv1d_kcp(x, t["weight"], bias, activation=activation, ctx=ctx)

    outcomes = kcp.VirtualWorld(3, timeout=20.0).run(body, return_exceptions=True, timeout=40.0)
    for r, out in enumerate(outcomes):
        assert isinstance(out, ValueError), f"rank {r}: expected ValueError, got {out!r}"
    if what == "context":
        assert all("causal_conv1d_kcp: the ranks disagree on context" in str(e)
                   for e in outcomes)


@pytest.mark.parametrize("what", ["activation", "rejected"])
def test_later_calls_are_checked_with_their_halos(what):
    """After a first call agreed the sizes, a call sends its header with its halo tails (one
    all-gather): an activation that differs, or a rank that rejects its arguments, still raises
    on every rank."""
    cu = [0, 30, 64]
    t = make(0, cu, 4, extras=False)

    def body(ex):
        counting = CountingExchange(ex)
        ctx = kcp.build_context(cu, exchange=counting)
        x = kcp.shard(t["x"], ctx)
        kcp.causal_conv1d_kcp(x, t["weight"], ctx=ctx)
        counting.calls = 0
        kwargs = {}
        if ex.rank == 1:
            if what == "activation":
                kwargs["activation"] = "silu"
            else:
                x = x[:, 1:]
        try:
            return kcp.causal_conv1d_kcp(x, t["weight"], ctx=ctx, **kwargs)
        finally:
            assert counting.calls == 1

    outcomes = kcp.VirtualWorld(2, timeout=20.0).run(body, return_exceptions=True, timeout=40.0)
    for r, out in enumerate(outcomes):
        assert isinstance(out, ValueError), f"rank {r}: expected ValueError, got {out!r}"
    if what == "activation":
        assert all("disagree on activation" in str(e) for e in outcomes)
    else:
        assert "x_local must be" in str(outcomes[1]) and "rank(s) [1]" in str(outcomes[0])


def test_argument_errors():
    ctx = kcp.build_context([0, 10], world_size=1)
    x = torch.zeros(1, 10, D, dtype=torch.float64)
    with pytest.raises(TypeError, match="ctx must be a cake.kcp.Context"):
        kcp.causal_conv1d_kcp(x, torch.zeros(D, 4))
    with pytest.raises(ValueError, match=r"x_local must be \[1, T_local, D\] with T_local = 10"):
        kcp.causal_conv1d_kcp(x[:, :9], torch.zeros(D, 4), ctx=ctx)
    with pytest.raises(ValueError, match=r"activation must be None, 'silu' or 'swish'"):
        kcp.causal_conv1d_kcp(x, torch.zeros(D, 4), activation="gelu", ctx=ctx)
    with pytest.raises(ValueError, match=r"weight must be \[D, W\] with D = 3"):
        kcp.causal_conv1d_kcp(x, torch.zeros(D + 1, 4), ctx=ctx)
    with pytest.raises(ValueError, match=r"bias must have shape \[D\]"):
        kcp.causal_conv1d_kcp(x, torch.zeros(D, 4, dtype=torch.float64),
                              torch.zeros(D + 1, dtype=torch.float64), ctx=ctx)
