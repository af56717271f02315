"""cake.kcp on the CPU with virtual ranks (one thread per rank): context-parallel GDN and KDA equal
the single-rank op in FP64 (outputs, final states and every gradient, relative error <= 1e-9) over
packs x W x layouts x segments; contexts and calls that differ between ranks raise ValueError on
every rank without hanging; shard/unshard; exchange byte counts; argument errors."""

import itertools

import pytest
import torch

import cake.kcp as kcp
from cake import abi
from conftest import assert_rel, call_cake, cotangents, gradients, leaf_names, leaves, make_case

TOL = 1e-9
TIMEOUT = 60.0
PER_TOKEN = ("q", "k", "v", "g", "beta")
PER_BATCH = ("initial_state", "A_log", "dt_bias")  # same tensor on every rank: partial gradients

# Global cu_seqlens of the packs. Lengths in tokens; a chunk is 64.
PACKS = {
    "short": [0, 5, 17, 20, 58, 59, 90],      # every document shorter than a chunk
    "long": [0, 700, 705, 760],               # 11 chunks: spans 3+ ranks from W = 3 on
    "empty": [0, 0, 150, 151, 151, 484, 491],  # empty documents, one of 6 chunks
    "few": [0, 200, 290],                     # W > N: ranks holding no whole document
    "tiny": [0, 3],                           # T < W: ranks holding no token
}
WORLD_SIZES = (1, 2, 3, 4, 8)
SEGMENTS = (1, 2, 3, 5)
VARIANTS = ("gdn", "kda")

# Option sets: (make_case keywords, extra op keywords).
OPTION_SETS = (
    ({"initial_state": True, "l2norm": True}, {}),
    ({"initial_state": False, "output_final_state": False}, {}),
    ({"initial_state": True, "gate": True, "dt_bias": True, "beta_sigmoid": True}, {}),
    ({"initial_state": True, "beta_sigmoid": True, "allow_neg_eigval": True, "scale": 0.3,
      "V": 16}, {"state_v_first": True}),
)


def _grid():
    """A subsample of packs x W x layout x P x variant x options x GVA that takes every value of
    every axis, and every (W, layout) pair with both variants."""
    cases = []
    pack_names = list(PACKS)
    for i, (W, layout) in enumerate(itertools.product(WORLD_SIZES, kcp.LAYOUTS)):
        for j in range(3):
            n = 3 * i + j
            cases.append(dict(
                pack=pack_names[(n + i) % len(pack_names)], W=W, layout=layout,
                P=SEGMENTS[(i + 2 * j) % len(SEGMENTS)], variant=VARIANTS[(i + j) % 2],
                options=n % len(OPTION_SETS), HV=1 + ((n + 1) // 2) % 2,
                K=8 if (n // 2) % 2 == 0 else 16, seed=n))
    return cases


GRID = _grid()


def _case_id(c):
    return (f"{c['pack']}-W{c['W']}-{c['layout']}-P{c['P']}-{c['variant']}-o{c['options']}"
            f"-HV{c['HV']}-K{c['K']}")


def test_grid_covers_every_axis():
    assert {c["W"] for c in GRID} == set(WORLD_SIZES)
    assert {c["layout"] for c in GRID} == set(kcp.LAYOUTS)
    assert {c["P"] for c in GRID} == set(SEGMENTS)
    assert {c["variant"] for c in GRID} == set(VARIANTS)
    assert {c["pack"] for c in GRID} == set(PACKS)
    assert {c["options"] for c in GRID} == set(range(len(OPTION_SETS)))
    assert {c["HV"] for c in GRID} == {1, 2}
    assert {c["K"] for c in GRID} == {8, 16}
    spans3 = holds_no_whole = more_ranks_than_docs = cut = False
    for c in GRID:
        cu = PACKS[c["pack"]]
        shards = abi.kcp.partition(cu, c["W"], c["layout"])
        pieces = [f.num_pieces for s in shards for f in s.fragments]
        spans3 |= max(pieces) >= 3
        holds_no_whole |= any(s.fragments and all(f.num_pieces > 1 for f in s.fragments)
                              for s in shards)
        more_ranks_than_docs |= c["W"] > len(cu) - 1
        cut |= any(len(abi.kcp.segment_bounds(-(-(f.global_range.end - f.global_range.begin)
                                                // 64), c["P"])) > 2
                   for s in shards for f in s.fragments)
    assert spans3 and holds_no_whole and more_ranks_than_docs and cut


def mild(t, opts):
    """Slows the decays in place (gate, beta), so that a state carried across hundreds of tokens
    and several ranks still changes the results far above the 1e-9 tolerance."""
    with torch.no_grad():
        if not opts.get("use_gate_in_kernel"):
            t["g"].mul_(0.05)
        elif "A_log" in t and opts.get("lower_bound") is None:
            t["A_log"].sub_(5.0)
        if opts.get("use_beta_sigmoid_in_kernel"):
            t["beta"].sub_(2.0)
        else:
            t["beta"].mul_(0.2)
    return t, opts


def _single_rank(kda, t, opts, seed):
    """The single-rank op's outputs, the cotangents and every gradient of <o, do> + <ht, dht>."""
    o, ht = call_cake(kda, t, opts)
    do, dht = cotangents(o.detach(), None if ht is None else ht.detach(), seed)
    grads = dict(zip(leaf_names(t), gradients(o, ht, do, dht, leaves(t))))
    return o.detach(), None if ht is None else ht.detach(), do, dht, grads


def _kcp_rank(exchange, kda, t, opts, layout, P, do, dht):
    """One rank: shard the inputs, run the KCP op, take its backward of this rank's part of the
    loss. Returns (ctx, o_local, final_state, {name: local grad}, {name: partial grad})."""
    ctx = kcp.build_context(t["cu_seqlens"], exchange=exchange, layout=layout, segments=P)
    local = {n: kcp.shard(t[n].detach(), ctx).requires_grad_() for n in PER_TOKEN}
    shared = {n: t[n].detach().clone().requires_grad_() for n in PER_BATCH if n in t}
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
    o, ht = fn(*(local[n] for n in PER_TOKEN), ctx, **opts, **shared)
    loss = (o * kcp.shard(do, ctx)).sum()
    if ht is not None:
        loss = loss + (ht * dht).sum()
    loss.backward()
    grad = lambda x: torch.zeros_like(x) if x.grad is None else x.grad  # noqa: E731
    return (ctx, o.detach(), None if ht is None else ht.detach(),
            {n: grad(x) for n, x in local.items()}, {n: grad(x) for n, x in shared.items()})


def _assemble(ctx_and_parts, like):
    """The global [1, T, ...] tensor from every rank's local [1, T_local, ...] part."""
    out = torch.full_like(like, float("nan"))
    for ctx, part in ctx_and_parts:
        offset = 0
        for r in ctx.global_ranges:
            out[:, r.begin:r.end] = part[:, offset:offset + r.size]
            offset += r.size
    return out


def _check_kcp(kda, t, opts, W, layout, P, seed, tol=TOL):
    o, ht, do, dht, want = _single_rank(kda, t, opts, seed)
    world = kcp.VirtualWorld(W, timeout=TIMEOUT)
    ranks = world.run(lambda ex: _kcp_rank(ex, kda, t, opts, layout, P, do, dht))
    assert_rel(_assemble([(r[0], r[1]) for r in ranks], o), o, tol, "o")
    if ht is None:
        assert all(r[2] is None for r in ranks)
    else:
        filled = [0] * ht.shape[0]
        for ctx, _, final, _, _ in ranks:
            mine = set(ctx.final_documents)
            for n in range(ht.shape[0]):
                if n in mine:
                    filled[n] += 1
                    assert_rel(final[n], ht[n], tol, f"final_state[{n}] on rank {ctx.rank}")
                else:
                    assert not final[n].any(), f"final_state[{n}] on rank {ctx.rank} not zero"
        assert filled == [1] * ht.shape[0]
        assert_rel(sum(r[2] for r in ranks), ht, tol, "final_state summed over ranks")
    for n in PER_TOKEN:
        assert_rel(_assemble([(r[0], r[3][n]) for r in ranks], t[n]), want[n], tol, f"d{n}")
    for n in PER_BATCH:
        if n in t:
            assert_rel(sum(r[4][n] for r in ranks), want[n], tol, f"d{n} summed over ranks")


@pytest.mark.parametrize("c", GRID, ids=_case_id)
def test_kcp_equals_single_rank(c):
    case_kwargs, op_kwargs = OPTION_SETS[c["options"]]
    kda = c["variant"] == "kda"
    dims = {"K": c["K"], "V": case_kwargs.get("V", c["K"])}
    case_kwargs = {n: x for n, x in case_kwargs.items() if n != "V"}
    t, opts = mild(*make_case(c["seed"], kda=kda, cu=PACKS[c["pack"]], HV=c["HV"], **dims,
                              **case_kwargs))
    opts.update(op_kwargs)
    if op_kwargs.get("state_v_first"):
        t["initial_state"] = t["initial_state"].detach().transpose(-1, -2).contiguous() \
            .requires_grad_()
    _check_kcp(kda, t, opts, c["W"], c["layout"], c["P"], c["seed"])


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_gva_and_gate_options(kda):
    """GVA with H = 2, HV = 4, the in-op gate (KDA: with lower_bound), on a pack whose middle
    document spans every rank."""
    extra = {"lower_bound": -0.05} if kda else {}
    t, opts = mild(*make_case(11, kda=kda, cu=[0, 40, 400, 430], H=2, HV=4, initial_state=True,
                              gate=True, dt_bias=True, l2norm=True, **extra))
    _check_kcp(kda, t, opts, 4, "zigzag", 2, 11)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_float32_close_to_single_rank(kda):
    """float32 inputs: records and states are float32, so KCP equals the single-rank op to float32
    rounding of the carried states."""
    t, opts = mild(*make_case(4, kda=kda, cu=PACKS["empty"], HV=2, initial_state=True,
                              dtype=torch.float32))
    _check_kcp(kda, t, opts, 3, "zigzag_per_document", 2, 4, tol=2e-5)


def test_segment_plan_rule_and_override():
    """segments=None applies plan_segments' rule (P = 4 for one 1024-chunk crossing fragment of
    32 heads on 132 SMs, docs/design/context-parallel.md); the override forces P everywhere."""
    cu = [0, 2 * 1024 * 64]
    ctx = kcp.build_context(cu, world_size=2, rank=0)
    assert ctx.segment_plan(32) == (4, 4)
    assert ctx.segments_for(64) == 2
    assert kcp.build_context(cu, world_size=2, rank=1, segments=3).segment_plan(32) == (3, 3)
    for bad in (17, -1, 2.0, True):
        with pytest.raises(ValueError, match="segments"):
            kcp.build_context(cu, world_size=2, rank=0, segments=bad)


def test_span_products_cover_every_span_once(monkeypatch):
    """Spans of many lengths (1 to 6520 rows, a chunk, one past it): the long ones as runs, the
    others in batches, where every span's rows, tokens and item are found exactly once among the
    real rows, the padding flagged, read inside its span and written past the shard's end; with
    the batches' row budget forced down and no span long, each length takes several and a span
    past half the budget goes alone, unpadded."""
    from cake.kcp import plan
    gen = torch.Generator().manual_seed(5)
    lengths = [1, 63, 64, 65, 128, 129, 700, 1025, 2047, 2048, 3555, 6520, 0] + torch.randint(
        1, 300, (20,), generator=gen).tolist()
    spans, at, row = [], 0, 0
    for item, n in enumerate(lengths):
        spans.append(plan.Span(item, at, row, n))
        at, row = at + n + 3, row + n  # a shard with other tokens between the spans
    num_tokens = at
    for budget, long_rows in ((plan.SPAN_BATCH_ROWS, plan.LONG_SPAN_ROWS), (128, 1 << 30)):
        monkeypatch.setattr(plan, "SPAN_BATCH_ROWS", budget)
        monkeypatch.setattr(plan, "LONG_SPAN_ROWS", long_rows)
        products = plan.span_products(spans, num_tokens, torch.device("cpu"))
        assert products.runs == tuple(s for s in spans if s.length >= plan.LONG_SPAN_ROWS)
        seen = {s.item: 1 for s in products.runs}
        for b in products.batches:
            n, L = b.rows.shape
            assert (L % 64 == 0 and budget >= L * n) or \
                (n == 1 and L > budget // 2)  # a long span alone, unpadded
            padding = torch.zeros(n * L, dtype=torch.bool)
            padding[b.padding_at] = True
            padding = padding.view(n, L)
            assert torch.equal(padding.flatten().nonzero().squeeze(1), b.padding_at)
            assert torch.equal(b.out_tokens, torch.where(padding, num_tokens, b.tokens).flatten())
            for j, item in enumerate(b.items.tolist()):
                _, at, row, length = spans[item]
                assert L == plan.padded_length(length) or (L == length > budget // 2)
                assert length < plan.LONG_SPAN_ROWS
                assert length <= L < length + max(64, length / 8)
                real = ~padding[j]
                assert real.sum().item() == length and real[:length].all()
                assert torch.equal(b.rows[j][real], torch.arange(row, row + length))
                assert torch.equal(b.tokens[j][real], torch.arange(at, at + length))
                assert ((b.rows[j] >= row) & (b.rows[j] < row + length)).all()
                seen[item] = seen.get(item, 0) + 1
        assert seen == {item: 1 for item, n in enumerate(lengths) if n}  # none of no rows
        if budget == 128:
            assert len(products.batches) > len({b.rows.shape[1] for b in products.batches})
            assert (1, 6520) in {tuple(b.rows.shape) for b in products.batches}


@pytest.mark.parametrize("P", [0, 1, 3])
@pytest.mark.parametrize("layout", kcp.LAYOUTS)
def test_call_plans_write_every_token_of_o_once(layout, P):
    """The forward's o is left unset where neither kind writes it: every local token must be a
    real row of one summary span or one token of the walked rest, and only one."""
    for cu in (PACKS["long"], PACKS["empty"], PACKS["few"], [0, 3000, 3001, 4500]):
        for W in (1, 3, 4):
            for rank in range(W):
                ctx = kcp.build_context(cu, world_size=W, rank=rank, segments=P)
                for has_h0 in (False, True):
                    plan = ctx.call_plan(P, has_h0, True, torch.device("cpu"))
                    spans = plan.summary_spans
                    written = [b.out_tokens[b.out_tokens < ctx.num_tokens] for b in spans.batches]
                    written += [torch.arange(s.token, s.token + s.length) for s in spans.runs]
                    if plan.rest is not None:
                        written.append(torch.arange(ctx.num_tokens)
                                       if plan.rest.index is None else plan.rest.index)
                    got = torch.cat(written).sort().values if written else torch.zeros(0)
                    assert torch.equal(got, torch.arange(ctx.num_tokens)), (W, rank)


def test_o_is_no_view_and_takes_in_place_ops():
    """o of the summarised segments is scattered into a buffer one row longer (the products'
    padding rows land there) and returned without that row: not as a view, which autograd would
    not let a caller modify in place."""
    t, opts = make_case(3, kda=False, cu=PACKS["long"], HV=2, initial_state=True)

    def rank(exchange):
        ctx = kcp.build_context(t["cu_seqlens"], exchange=exchange, layout="zigzag", segments=2)
        local = {n: kcp.shard(t[n].detach(), ctx).requires_grad_() for n in PER_TOKEN}
        o, _ = kcp.chunk_gated_delta_rule_kcp(*(local[n] for n in PER_TOKEN), ctx, **opts,
                                              initial_state=t["initial_state"].detach())
        assert o._base is None and o.is_contiguous()
        o.mul_(2)
        o.sum().backward()
        return local["v"].grad

    assert all(torch.isfinite(g).all() for g in kcp.VirtualWorld(3, timeout=TIMEOUT).run(rank))


@pytest.mark.parametrize("long_rows", [1, 32, 1 << 30], ids=["runs", "both", "batches"])
def test_span_products_give_the_same_results(monkeypatch, long_rows):
    """The segments' o and C products with one span per batch (the batches' row budget at one
    chunk), every span as a run, or some of each, against the single-rank op, as
    test_kcp_equals_single_rank."""
    from cake.kcp import plan
    monkeypatch.setattr(plan, "SPAN_BATCH_ROWS", 64)
    monkeypatch.setattr(plan, "LONG_SPAN_ROWS", long_rows)
    for kda in (False, True):
        t, opts = mild(*make_case(7, kda=kda, cu=PACKS["empty"], HV=2, initial_state=True))
        _check_kcp(kda, t, opts, 3, "zigzag", 3, 7)


def test_segments_are_walked(monkeypatch):
    """P = 3 on one rank holding the "long" pack: the 11-chunk document is walked as 3 segments
    (chunks 4, 4, 3) in the summary walks, which also give its o; the short documents are walked
    once, as one sequence each."""
    import cake.ops

    walks = []
    forward = cake.ops._forward

    def recording(variant, q, k, v, g, beta, h0, cu_seqlens, *rest):
        walks.append(cu_seqlens.tolist())
        return forward(variant, q, k, v, g, beta, h0, cu_seqlens, *rest)

    monkeypatch.setattr(cake.ops, "_forward", recording)
    t, opts = make_case(0, kda=False, cu=PACKS["long"])
    ctx = kcp.build_context(t["cu_seqlens"], segments=3)
    kcp.chunk_gated_delta_rule_kcp(*(t[n] for n in PER_TOKEN), ctx)
    # Summary walks (B, then M) over the cut document, then the walk of the rest.
    assert walks == [[0, 256, 512, 700]] * 2 + [[0, 5, 60]]


def test_no_grad_forward_matches():
    """Without gradients (no adjoint work is prepared) the outputs are the same."""
    t, opts = mild(*make_case(5, kda=True, cu=PACKS["long"], initial_state=True))
    o, ht = call_cake(True, t, opts)

    def body(ex):
        ctx = kcp.build_context(t["cu_seqlens"], exchange=ex, layout="zigzag_per_document",
                                segments=3)
        with torch.no_grad():
            local = [kcp.shard(t[n], ctx) for n in PER_TOKEN]
            out, final = kcp.chunk_kda_kcp(*local, ctx, initial_state=t["initial_state"],
                                           output_final_state=True)
            return kcp.unshard(out, ctx), final

    ranks = kcp.VirtualWorld(3, timeout=TIMEOUT).run(body)
    assert not ranks[0][0].requires_grad
    assert_rel(ranks[1][0], o.detach(), TOL, "o")
    assert_rel(sum(r[1] for r in ranks), ht.detach(), TOL, "final_state")


def test_a_no_grad_call_then_a_grad_call_on_one_context():
    """A context keeps one call plan per kind of call: the plan of a no_grad call prepares no
    adjoint work, so a later call with gradients on the same context must build its own (the
    gradients are the single-rank ones)."""
    t, opts = mild(*make_case(8, kda=False, cu=PACKS["long"], initial_state=True))
    o, ht, do, dht, want = _single_rank(False, t, opts, 8)

    def body(ex):
        ctx = kcp.build_context(t["cu_seqlens"], exchange=ex, layout="zigzag", segments=2)
        h0 = t["initial_state"].detach()
        with torch.no_grad():
            kcp.chunk_gated_delta_rule_kcp(*(kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN),
                                           ctx, initial_state=h0, **opts)
        local = {n: kcp.shard(t[n].detach(), ctx).requires_grad_() for n in PER_TOKEN}
        h0 = h0.clone().requires_grad_()
        o_local, final = kcp.chunk_gated_delta_rule_kcp(*local.values(), ctx, initial_state=h0,
                                                        **opts)
        ((o_local * kcp.shard(do, ctx)).sum() + (final * dht).sum()).backward()
        return ctx, {n: x.grad for n, x in local.items()}, h0.grad

    ranks = kcp.VirtualWorld(3, timeout=TIMEOUT).run(body)
    for n in PER_TOKEN:
        assert_rel(_assemble([(r[0], r[1][n]) for r in ranks], t[n]), want[n], TOL, f"d{n}")
    assert_rel(sum(r[2] for r in ranks), want["initial_state"], TOL, "dinitial_state")


def test_design_example_fragments():
    """The worked example of docs/design/context-parallel.md: lengths [5, 12, 3], W = 2."""
    cu = torch.tensor([0, 5, 17, 20], dtype=torch.int32)
    ctx0 = kcp.build_context(cu, world_size=2, rank=0, layout="zigzag")
    ctx1 = kcp.build_context(cu, world_size=2, rank=1, layout="zigzag")
    assert ctx0.cu_seqlens.tolist() == [0, 5, 7, 10] and ctx0.cu_seqlens.dtype == torch.int32
    assert ctx1.cu_seqlens.tolist() == [0, 10]
    assert ctx0.global_ranges == (kcp.TokenRange(0, 5), kcp.TokenRange(15, 20))
    f = ctx0.fragments[1]
    assert (f.document, f.piece, f.state_in, f.state_out) == (1, 1, True, False)
    assert f.previous == kcp.FragmentRef(1, 0) and f.next is None
    assert f.local_range == kcp.TokenRange(5, 7) and f.adjoint_slot == 0
    assert ctx1.fragments[0].summary_slot == 0 and ctx1.fragments[0].next == kcp.FragmentRef(0, 1)
    assert ctx0.final_documents == (0, 1, 2) and ctx1.final_documents == ()
    per_doc = kcp.build_context(cu, world_size=2, rank=1, layout="zigzag_per_document")
    assert per_doc.cu_seqlens.tolist() == [0, 2, 8, 10]
    # The exchange of the example: HV = 4, K = 8, V = 16, 3 slots of 3072 bytes each way.
    b = kcp.build_context(cu, world_size=2, rank=0, layout="zigzag_per_document") \
        .exchange_bytes(4, 8, 16)
    assert (b.record_bytes, b.forward_slots, b.backward_slots) == (3072, 3, 3)
    assert b.forward_send == b.header_bytes + 3 * 3072 and b.forward_receive == b.forward_send
    assert b.backward_send == b.backward_receive == 3 * 3072


@pytest.mark.parametrize("layout", kcp.LAYOUTS)
@pytest.mark.parametrize("W", [1, 3, 8])
def test_shard_unshard_round_trip(layout, W):
    cu = PACKS["empty"]
    x = torch.randn(1, cu[-1], 2, 3, dtype=torch.float64, requires_grad=True)

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout=layout)
        local = kcp.shard(x, ctx)
        assert local.shape == (1, ctx.num_tokens, 2, 3)
        full = kcp.unshard(local, ctx)
        weight = torch.arange(full.numel(), dtype=full.dtype).reshape(full.shape)
        (grad,) = torch.autograd.grad((full * weight).sum(), x)
        return full.detach(), grad, kcp.shard(weight, ctx), ctx

    ranks = kcp.VirtualWorld(W, timeout=TIMEOUT).run(body)
    for full, grad, weight_local, ctx in ranks:
        assert torch.equal(full, x.detach())
        # This rank's tokens get the weight's gradient; the others none.
        assert torch.equal(kcp.shard(grad, ctx), weight_local)
        assert grad.abs().sum() == weight_local.abs().sum()
    assert sum(r[3].num_tokens for r in ranks) == cu[-1]


class CountingExchange(kcp.Exchange):
    """Counts the bytes this rank sends to and receives from the others in all-gathers."""

    def __init__(self, inner):
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.sent = self.received = self.calls = 0

    def all_gather(self, tensor):
        out = self.inner.all_gather(tensor)
        self.calls += 1
        self.sent += tensor.numel() * tensor.element_size()
        self.received += sum(x.numel() * x.element_size() for r, x in enumerate(out)
                             if r != self.rank)
        return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("W,layout,pack", [(1, "contiguous", "long"), (3, "zigzag", "long"),
                                           (4, "zigzag_per_document", "empty"),
                                           (2, "contiguous", "short")])
def test_exchange_bytes_equal_bytes_gathered(W, layout, pack, dtype):
    t, opts = make_case(3, kda=False, cu=PACKS[pack], HV=2, K=8, V=16, initial_state=True,
                        dtype=dtype)

    def body(ex):
        counting = CountingExchange(ex)
        ctx = kcp.build_context(t["cu_seqlens"], exchange=counting, layout=layout)
        expected = ctx.exchange_bytes(2, 8, 16, dtype=torch.float64 if dtype == torch.float64
                                      else torch.float32)

        def step():
            counting.sent = counting.received = 0
            local = [kcp.shard(t[n].detach(), ctx).requires_grad_() for n in PER_TOKEN]
            o, ht = kcp.chunk_gated_delta_rule_kcp(*local, ctx, initial_state=t["initial_state"],
                                                   output_final_state=True)
            forward = (counting.sent, counting.received)
            (o.double().sum() + ht.double().sum()).backward()
            return forward, (counting.sent - forward[0], counting.received - forward[1])

        return expected, step(), step()

    for expected, first, later in kcp.VirtualWorld(W, timeout=TIMEOUT).run(body):
        # The first call of these sizes on the exchange also agrees them: one more header.
        agreement = (expected.header_bytes, (W - 1) * expected.header_bytes)
        assert first[0] == tuple(a + b for a, b in zip(agreement, later[0]))
        forward, backward = later
        assert forward == (expected.forward_send, expected.forward_receive)
        assert backward == (expected.backward_send, expected.backward_receive)
        assert first[1] == backward
        if W > 1 and pack == "long":
            assert expected.forward_slots >= 1 and expected.backward_slots >= 1


def _all_raise(W, body, match=None):
    """Runs body on W virtual ranks; every rank must raise ValueError (matching `match`), and
    none may hang: the barrier and the run have timeouts."""
    outcomes = kcp.VirtualWorld(W, timeout=20.0).run(body, return_exceptions=True, timeout=40.0)
    for r, out in enumerate(outcomes):
        assert isinstance(out, ValueError), f"rank {r}: expected ValueError, got {out!r}"
        if match is not None:
            assert match in str(out), f"rank {r}: {match!r} not in {out}"
    return outcomes


@pytest.mark.parametrize("what", ["cu_seqlens", "layout", "segments", "num_sms", "world_size",
                                  "rank"])
def test_mismatched_contexts_raise_on_every_rank(what):
    def body(ex):
        kwargs = dict(layout="zigzag", segments=2, num_sms=132)
        cu = [0, 100, 250]
        if ex.rank == 1:
            if what == "cu_seqlens":
                cu = [0, 101, 250]
            elif what in ("layout", "segments", "num_sms"):
                kwargs[what] = {"layout": "contiguous", "segments": 3, "num_sms": 100}[what]
            elif what == "world_size":
                kwargs["world_size"] = 2
            else:
                kwargs["rank"] = 0
        return kcp.build_context(cu, exchange=ex, **kwargs)

    outcomes = _all_raise(3, body)
    if what in ("cu_seqlens", "layout", "segments", "num_sms"):
        assert all(what in str(e) for e in outcomes)
    else:
        assert what in str(outcomes[1]) and "rank(s) [1] rejected" in str(outcomes[0])


def test_bad_cu_seqlens_on_one_rank_raises_on_every_rank():
    def body(ex):
        cu = [0, 100, 50] if ex.rank == 2 else [0, 100, 150]
        return kcp.build_context(cu, exchange=ex)

    outcomes = _all_raise(3, body)
    assert "non-decreasing" in str(outcomes[2]) and "rejected" in str(outcomes[0])


@pytest.mark.parametrize("what", ["head_dim_v", "q_tokens", "l2norm", "initial_state", "kda",
                                  "scale", "grad", "num_heads", "dtype", "lower_bound",
                                  "dt_bias"])
def test_mismatched_calls_raise_on_every_rank(what):
    cu = [0, 100, 250]
    t, _ = make_case(1, kda=False, cu=cu, HV=2, initial_state=True)
    # what rank 1 calls with where its inputs differ (num_heads: H = 2 at the same HV, K, V;
    # dtype: float32, whose records are float32 too)
    odd_inputs = {"head_dim_v": make_case(1, kda=False, cu=cu, HV=2, V=16)[0],
                  "kda": make_case(1, kda=True, cu=cu, HV=2)[0],
                  "num_heads": make_case(1, kda=False, cu=cu, H=2, HV=2)[0],
                  "dtype": make_case(1, kda=False, cu=cu, HV=2, dtype=torch.float32)[0]}
    # both ranks' inputs where only an option differs: KDA's bounded gate, GDN's in-op gate
    gated = {"lower_bound": make_case(1, kda=True, cu=cu, HV=2, gate=True)[0],
             "dt_bias": make_case(1, kda=False, cu=cu, HV=2, gate=True, dt_bias=True)[0]}

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout="zigzag")
        odd = ex.rank == 1
        src = odd_inputs[what] if odd and what in odd_inputs else gated.get(what, t)
        local = [kcp.shard(src[n].detach(), ctx) for n in PER_TOKEN]
        kwargs = {}
        if what in gated:
            kwargs.update(use_gate_in_kernel=True, A_log=src["A_log"].detach())
        if what == "lower_bound":
            kwargs["lower_bound"] = -2.0 if odd else -1.0
        if what == "dt_bias" and odd:
            kwargs["dt_bias"] = src["dt_bias"].detach()
        if what == "q_tokens" and odd:
            local[0] = local[0][:, 1:]
        if what == "l2norm" and odd:
            kwargs["use_qk_l2norm_in_kernel"] = True
        if what == "initial_state" and not odd:
            kwargs["initial_state"] = t["initial_state"].detach()
        if what == "scale" and odd:
            kwargs["scale"] = 0.5
        if what == "grad" and odd:
            local[2].requires_grad_()
        kda = (what == "kda" and odd) or what == "lower_bound"
        fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
        return fn(*local, ctx, **kwargs)

    outcomes = _all_raise(2, body)
    if what == "q_tokens":
        assert "q must be [1, T_local, H, K]" in str(outcomes[1])
        assert "rank(s) [1] rejected" in str(outcomes[0])
    else:
        field = {"head_dim_v": "head_dim_v", "l2norm": "flags", "initial_state": "flags",
                 "kda": "variant", "scale": "scale", "grad": "needs_grad",
                 "num_heads": "num_heads", "dtype": "dtype", "lower_bound": "lower_bound",
                 "dt_bias": "flags"}[what]
        assert all(f"disagree on {field}" in str(e) or f"; {field}" in str(e) for e in outcomes)


def test_op_error_on_one_rank_raises_on_every_rank():
    """An error found by the single-rank validation on one rank (A_log of the wrong size) is
    reported to the others before any record is exchanged."""
    cu = [0, 100, 250]
    t, _ = make_case(2, kda=False, cu=cu, HV=2, gate=True)

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout="contiguous")
        local = [kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN]
        A_log = t["A_log"].detach()
        return kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True,
                                              A_log=A_log[:1] if ex.rank == 0 else A_log)

    outcomes = _all_raise(2, body)
    assert "A_log" in str(outcomes[0]) and "rejected" in str(outcomes[1])


def _later_call(what):
    """A body for 2 virtual ranks: a first call agrees the sizes; in a second call of the same
    sizes, rank 1 changes the scale or passes an A_log of the wrong size. Returns (forward
    all-gathers of the second call, whether its o has NaN, the error of check_calls or None)."""
    cu = [0, 100, 250]
    t, _ = make_case(2, kda=False, cu=cu, HV=2, gate=True)

    def body(ex):
        counting = CountingExchange(ex)
        ctx = kcp.build_context(cu, exchange=counting, layout="zigzag")
        local = [kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN]
        A_log = t["A_log"].detach()
        kwargs = dict(use_gate_in_kernel=True, A_log=A_log)
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, **kwargs)
        if ex.rank == 1:
            kwargs.update(scale=0.5) if what == "scale" else kwargs.update(A_log=A_log[:1])
        counting.calls = 0
        try:
            o, _ = kcp.chunk_gated_delta_rule_kcp(*local, ctx, **kwargs)
        finally:
            assert counting.calls == 1, "the second call all-gathers once: header and records"
        try:
            kcp.check_calls(ctx)
        except ValueError as e:
            return bool(o.isnan().any()), str(e)
        return bool(o.isnan().any()), None

    return body


@pytest.mark.parametrize("what", ["scale", "rejected"])
def test_later_calls_are_checked_with_their_records(what):
    """After the first call of its sizes, a call sends its header with its records: a
    disagreement still raises on every rank (at once, on CPU tensors)."""
    outcomes = _all_raise(2, _later_call(what))
    if what == "scale":
        assert all("disagree on scale (rank 0: " in str(e) for e in outcomes)
    else:
        assert "A_log" in str(outcomes[1]) and "rank(s) [1] rejected" in str(outcomes[0])


@pytest.mark.parametrize("what", ["scale", "rejected"])
def test_disagreement_read_later_poisons_and_raises_on_every_rank(monkeypatch, what):
    """Where reading the verdict would wait for the device (CUDA tensors; simulated here), the
    call returns with the received states NaN and check_calls raises on every rank."""
    monkeypatch.setattr(kcp.check, "_reads_now", lambda headers: False)
    outcomes = kcp.VirtualWorld(2, timeout=20.0).run(_later_call(what), return_exceptions=True,
                                                     timeout=40.0)
    if what == "scale":
        for nan, error in outcomes:
            assert nan, "the states received from a disagreeing rank must be NaN"
            assert "disagree on scale" in error
    else:  # the rejecting rank raises its own error at once; the other learns it later
        assert isinstance(outcomes[1], ValueError) and "A_log" in str(outcomes[1])
        nan, error = outcomes[0]
        assert nan and "rank(s) [1] rejected" in error


def _zigzag_shard(ex, t, cu):
    """A rank's zigzag context of the pack cu and its shard of t's per-token inputs."""
    ctx = kcp.build_context(cu, exchange=ex, layout="zigzag")
    return ctx, [kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN]


def test_build_context_raises_the_pending_verdicts(monkeypatch):
    monkeypatch.setattr(kcp.check, "_reads_now", lambda headers: False)
    cu = [0, 100, 250]
    t, _ = make_case(1, kda=False, cu=cu, HV=2)

    def body(ex):
        ctx, local = _zigzag_shard(ex, t, cu)
        kcp.chunk_gated_delta_rule_kcp(*local, ctx)
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, scale=0.5 if ex.rank else None)
        kcp.build_context(cu, exchange=ex, layout="zigzag")

    _all_raise(2, body, match="disagree on scale")


def test_rejection_read_later_raises_on_every_rank_at_build_context(monkeypatch):
    """Deferred verdicts (simulated): the rank that rejected its arguments raises at once, and
    keeps the verdict too, so that the next build_context raises on every rank (none left in a
    collective)."""
    monkeypatch.setattr(kcp.check, "_reads_now", lambda headers: False)
    cu = [0, 100, 250]
    t, _ = make_case(2, kda=False, cu=cu, HV=2, gate=True)

    def body(ex):
        ctx, local = _zigzag_shard(ex, t, cu)
        A_log = t["A_log"].detach()
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True, A_log=A_log)
        try:
            kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True,
                                           A_log=A_log[:1] if ex.rank == 1 else A_log)
        except ValueError as e:
            assert ex.rank == 1 and "A_log" in str(e)
        kcp.build_context(cu, exchange=ex, layout="zigzag")

    _all_raise(2, body, match="rank(s) [1] rejected")


def test_pending_verdicts_stay_one_per_kind_of_call(monkeypatch):
    """Many calls between two reads keep one pending verdict per kind of call (the first
    disagreement's headers), not one per call."""
    monkeypatch.setattr(kcp.check, "_reads_now", lambda headers: False)
    cu = [0, 100, 250]
    t, _ = make_case(1, kda=False, cu=cu, HV=2)

    def body(ex):
        ctx, local = _zigzag_shard(ex, t, cu)
        for i in range(20):
            scale = 0.5 if (ex.rank == 1 and i == 7) else None
            kcp.chunk_gated_delta_rule_kcp(*local, ctx, scale=scale)
        assert len(kcp.check.state_of(ex).pending) == 1
        kcp.check_calls(ctx)

    _all_raise(2, body, match="disagree on scale (rank 0: ")


def test_a_rejected_cpu_call_leaves_nothing_pending():
    """On CPU tensors a rejection is read at once on every rank: the rejecting rank keeps no
    verdict of its own, so both ranks' next build_context and call go through (a verdict kept
    there would raise on that rank alone, the other left waiting in its collective)."""
    cu = [0, 100, 250]
    t, _ = make_case(2, kda=False, cu=cu, HV=2, gate=True)

    def body(ex):
        ctx, local = _zigzag_shard(ex, t, cu)
        A_log = t["A_log"].detach()
        # the first call agrees its sizes on the host; the second is checked with its records
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True, A_log=A_log)
        with pytest.raises(ValueError, match="A_log" if ex.rank else r"rank\(s\) \[1\] rejected"):
            kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True,
                                           A_log=A_log[:1] if ex.rank == 1 else A_log)
        ctx, local = _zigzag_shard(ex, t, cu)
        o, _ = kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_gate_in_kernel=True, A_log=A_log)
        return bool(o.isfinite().all())

    assert kcp.VirtualWorld(2, timeout=20.0).run(body, timeout=40.0) == [True, True]


def test_check_calls_clears_what_it_raised(monkeypatch):
    """A verdict is read once: after check_calls raised for a disagreement, the next
    check_calls (with no call between) passes on every rank."""
    monkeypatch.setattr(kcp.check, "_reads_now", lambda headers: False)
    cu = [0, 100, 250]
    t, _ = make_case(1, kda=False, cu=cu, HV=2)

    def body(ex):
        ctx, local = _zigzag_shard(ex, t, cu)
        kcp.chunk_gated_delta_rule_kcp(*local, ctx)  # agrees the sizes on the host
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, scale=0.5 if ex.rank else None)
        with pytest.raises(ValueError, match="disagree on scale"):
            kcp.check_calls(ctx)
        kcp.check_calls(ctx)
        return True

    assert kcp.VirtualWorld(2, timeout=20.0).run(body, timeout=40.0) == [True, True]


def test_argument_errors_name_the_argument():
    cu = [0, 100, 250]
    with pytest.raises(ValueError, match="layout must be one of .* got 'zig'"):
        kcp.build_context(cu, layout="zig")
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got 0"):
        kcp.build_context(cu, world_size=0)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\), got 2"):
        kcp.build_context(cu, world_size=2, rank=2)
    with pytest.raises(ValueError, match="cu_seqlens_global: cu_seqlens\\[0\\] must be 0"):
        kcp.build_context([1, 100])
    with pytest.raises(ValueError, match="cu_seqlens_global must be a 1-D integer tensor"):
        kcp.build_context(torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match="num_sms must be an integer >= 1, got 0"):
        kcp.build_context(cu, num_sms=0)
    with pytest.raises(ValueError, match="world_size: expected 2 \\(from exchange\\), got 3"):
        kcp.VirtualWorld(2, timeout=5).run(
            lambda ex: kcp.build_context(cu, exchange=ex, world_size=3))
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        kcp.build_context(cu, group=object())
    with pytest.raises(ValueError, match="pass group= .* or exchange=, not both"):
        kcp.build_context(cu, group=object(), exchange=kcp.SingleExchange())
    planning = kcp.build_context(cu, world_size=2, rank=1)
    t, _ = make_case(0, kda=False, cu=cu)
    local = [kcp.shard(t[n].detach(), planning) for n in PER_TOKEN]
    with pytest.raises(ValueError, match="has no exchange"):
        kcp.chunk_gated_delta_rule_kcp(*local, planning)
    with pytest.raises(ValueError, match=r"x must be a packed tensor \[1, 250, \.\.\.\]"):
        kcp.shard(torch.zeros(1, 249, 2), planning)

    ctx = kcp.build_context(cu)  # W = 1: the exchange is trivial
    q = t["q"].detach()
    args = [t[n].detach() for n in PER_TOKEN]
    with pytest.raises(ValueError, match=r"q must be \[1, T_local, H, K\] with T_local = 250"):
        kcp.chunk_gated_delta_rule_kcp(q[:, :10], *args[1:], ctx)
    with pytest.raises(ValueError, match="cu_seqlens must be None: the context gives"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, cu_seqlens=t["cu_seqlens"])
    with pytest.raises(ValueError, match="chunk_size must be one of"):
        kcp.chunk_kda_kcp(*args, ctx, chunk_size=128)
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, K, V\] = \[2, 2, 8, 8\]"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, initial_state=torch.zeros(3, 2, 8, 8,
                                                                              dtype=q.dtype))
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, V, K\] = \[2, 2, 8, 8\]"
                       r".* got \[3, 2, 8, 8\]"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, state_v_first=True,
                                       initial_state=torch.zeros(3, 2, 8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="initial_state must be on q's device \\(cpu\\), got meta"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, initial_state=torch.zeros(
            2, 2, 8, 8, dtype=q.dtype, device="meta"))
    with pytest.raises(ValueError, match="initial_state must be a torch.Tensor or None, got list"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, initial_state=[0.0], state_v_first=True)
    with pytest.raises(ValueError, match="x_local must be a packed tensor"):
        kcp.unshard(torch.zeros(1, 3), ctx)
    with pytest.raises(TypeError, match="ctx must be a cake.kcp.Context"):
        kcp.chunk_gated_delta_rule_kcp(*args, None)
    with pytest.raises(ValueError, match="sequence of ints, got 10.7 among its values"):
        kcp.build_context([0, 10.7, 20])
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got True"):
        kcp.build_context(cu, world_size=True)
    with pytest.raises(ValueError, match="rank must be an integer in .* got False"):
        kcp.build_context(cu, world_size=2, rank=False)


def test_shard_takes_one_packed_row():
    planning = kcp.build_context([0, 100, 250], world_size=2, rank=1)
    with pytest.raises(ValueError, match=r"x must be a packed tensor \[1, 250, \.\.\.\].* got "
                                         r"\(2, 250, 3\)"):
        kcp.shard(torch.zeros(2, 250, 3), planning)


def test_an_exchange_reporting_a_wrong_rank_raises_on_every_rank():
    """Rank r's table must be what position r of the exchange receives: an exchange whose ranks
    are swapped is refused on both."""

    class Swapped(kcp.Exchange):
        def __init__(self, inner):
            self.inner, self.world_size = inner, inner.world_size
            self.rank = inner.world_size - 1 - inner.rank

        def all_gather(self, tensor):
            return self.inner.all_gather(tensor)

    _all_raise(2, lambda ex: kcp.build_context([0, 100, 250], exchange=Swapped(ex)),
               match="rank r must sit at position r of the exchange, got ranks [1, 0]")


def test_the_largest_segment_count_is_accepted():
    cu = [0, 2 * 1024 * 64]
    ctx = kcp.build_context(cu, segments=kcp.context.MAX_SEGMENTS)
    assert kcp.context.MAX_SEGMENTS == 16 and ctx.segments_for(1) == 16


def test_booleans_are_not_integers():
    """True == 1 and False == 0 in Python: num_sms=True, or world_size=True and rank=False next
    to an exchange of one rank, are refused all the same."""
    cu = [0, 100, 250]
    with pytest.raises(ValueError, match="num_sms must be an integer >= 1, got True"):
        kcp.build_context(cu, num_sms=True)
    with pytest.raises(ValueError, match=r"world_size: expected 1 \(from exchange\), got True"):
        kcp.build_context(cu, exchange=kcp.SingleExchange(), world_size=True)
    with pytest.raises(ValueError, match=r"rank: expected 0 \(from exchange\), got False"):
        kcp.build_context(cu, exchange=kcp.SingleExchange(), rank=False)


def test_state_v_first_shape_error_shows_the_callers_layout():
    # K != V: the expected and the given shapes are shown as [N, HV, V, K], as the caller passes
    cu = [0, 100, 250]
    t, _ = make_case(0, kda=False, cu=cu, HV=2, K=8, V=16)
    ctx = kcp.build_context(cu)
    args = [t[n].detach() for n in PER_TOKEN]
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, V, K\] = \[2, 2, 16, 8\]"
                       r".* got \[3, 2, 16, 8\]"):
        kcp.chunk_gated_delta_rule_kcp(*args, ctx, state_v_first=True,
                                       initial_state=torch.zeros(3, 2, 16, 8, dtype=torch.float64))


def test_kcp_refuses_intermediate_states():
    # allowed by chunk_kda under inference_mode, not by its context-parallel form
    cu = [0, 100, 250]
    t, _ = make_case(0, kda=True, cu=cu, HV=2)
    ctx = kcp.build_context(cu)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="return_intermediate_states is not supported by "
                                             "cake.kcp"):
            kcp.chunk_kda_kcp(*(t[n].detach() for n in PER_TOKEN), ctx,
                              return_intermediate_states=True)


def test_initial_state_on_another_device_raises_on_every_rank():
    """Found on one rank (its initial_state elsewhere than its q), reported to both."""
    cu = [0, 100, 250]
    t, _ = make_case(1, kda=False, cu=cu, HV=2, initial_state=True)

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex)
        local = [kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN]
        h0 = t["initial_state"].detach()
        return kcp.chunk_gated_delta_rule_kcp(*local, ctx, initial_state=h0.to("meta")
                                              if ex.rank == 0 else h0)

    outcomes = _all_raise(2, body)
    assert "q's device" in str(outcomes[0]) and "rank(s) [0] rejected" in str(outcomes[1])


def _call_on_another_context(ex, t, cu_a, cu_b):
    """Both ranks build contexts of two batches, call on the first, then rank 1 calls on the
    second while rank 0 calls on the first again (their forward records differ in size)."""
    ctx_a = kcp.build_context(cu_a, exchange=ex, layout="zigzag_per_document")
    ctx_b = kcp.build_context(cu_b, exchange=ex, layout="zigzag_per_document")
    kcp.chunk_gated_delta_rule_kcp(*[kcp.shard(t[n].detach(), ctx_a) for n in PER_TOKEN], ctx_a)
    ctx = ctx_b if ex.rank == 1 else ctx_a
    return kcp.chunk_gated_delta_rule_kcp(*[kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN],
                                          ctx)


def test_every_call_check_catches_a_call_on_another_context(monkeypatch):
    """With CAKE_KCP_CHECK_EVERY_CALL=1 every call agrees on the host first, so two ranks on
    different contexts (records of different sizes) raise ValueError on both; without it, the
    exchange's collective of unequal sizes is what fails."""
    cu_a, cu_b = [0, 100, 250], [0, 250]
    t, _ = make_case(1, kda=False, cu=cu_a, HV=2)
    slots = [kcp.build_context(cu, world_size=2, layout="zigzag_per_document")
             .exchange_bytes(2, 8, 8).forward_slots for cu in (cu_a, cu_b)]
    assert slots[0] != slots[1]
    body = lambda ex: _call_on_another_context(ex, t, cu_a, cu_b)  # noqa: E731
    outcomes = kcp.VirtualWorld(2, timeout=20.0).run(body, return_exceptions=True, timeout=40.0)
    assert any("all_gather: every rank must send the same shape" in str(e) for e in outcomes)
    monkeypatch.setenv("CAKE_KCP_CHECK_EVERY_CALL", "1")
    outcomes = _all_raise(2, body)
    assert all("disagree on context" in str(e) and "forward_slots" in str(e) for e in outcomes)


def test_unshard_checks_the_context():
    """Two ranks unsharding with contexts of one pack in different layouts raise on both."""
    cu = [0, 100, 250]

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout="zigzag")
        other = kcp.build_context(cu, exchange=ex, layout="contiguous")
        x = torch.arange(250.0).view(1, 250, 1)
        local = kcp.shard(x, ctx)
        return kcp.unshard(local, other if ex.rank == 0 else ctx)

    outcomes = _all_raise(2, body)
    assert all("unshard: the ranks disagree on context" in str(e) for e in outcomes)


@pytest.mark.parametrize("what", ["dtype", "size[2]"])
def test_unshard_checks_dtype_and_trailing_sizes(what):
    """Ranks unsharding tensors of another dtype (float32 against bfloat16) or of other
    trailing sizes raise on both, naming what differs (not the all-gather's own failure)."""
    cu = [0, 100, 250]

    def body(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout="zigzag")
        x = torch.zeros(1, ctx.num_tokens, 2, 2)
        if ex.rank == 1:
            x = x.to(torch.bfloat16) if what == "dtype" else x[..., :1, :]
        return kcp.unshard(x, ctx)

    outcomes = _all_raise(2, body)
    assert all(f"unshard: the ranks disagree on {what}" in str(e) for e in outcomes)


def test_planning_binding():
    """cake.abi.kcp: layout_ranges and partition_ranges agree with partition; bad input is a
    ValueError carrying the C++ message."""
    cu = [0, 5, 17, 20]
    ranges = abi.kcp.layout_ranges(cu, 2, "zigzag")
    assert ranges == [[(0, 5), (15, 20)], [(5, 15)]]
    custom = abi.kcp.partition_ranges(cu, ranges)
    for a, b in zip(custom, abi.kcp.partition(cu, 2, "zigzag")):
        assert a.cu_seqlens == b.cu_seqlens
    with pytest.raises(ValueError, match=r"rank_ranges must tile \[0, 20\)"):
        abi.kcp.partition_ranges(cu, [[(0, 5)], [(6, 20)]])
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        abi.kcp.layout_ranges(cu, 0, "contiguous")
    with pytest.raises(ValueError, match="num_v_heads, head_dim_k and head_dim_v must be >= 1, got 0"):
        abi.kcp.summary_exchange(abi.kcp.partition(cu, 2, "zigzag"), 0, 8, 8)
    assert abi.kcp.segment_bounds(10, 3) == [0, 4, 7, 10]


def test_virtual_ranks_run_their_own_backward():
    """Each virtual rank's thread runs its backward passes itself: with autograd's one worker
    thread per CUDA device, one rank's backward would wait in an all-gather for the others queued
    behind it on that thread. On the CPU the engine always runs on the caller, so the test reads
    the thread's setting, and the main thread's stays as it was."""
    seen = kcp.VirtualWorld(3, timeout=TIMEOUT).run(
        lambda ex: torch._C._is_multithreading_enabled())
    assert seen == [False, False, False]
    assert torch._C._is_multithreading_enabled()
