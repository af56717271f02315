"""cake.kcp on CUDA tensors with virtual ranks on one GPU: the context-parallel GDN and KDA (the
summaries, their composition and the local walks all on the kernels) against the FP64 reference
of the whole pack, within the accuracy gate (bench/workloads.json: rel-RMS <= 1e-2, max-abs <=
2e-2 x max|ref|, all finite), for W = 2, 3, 4, 8, every layout, P = 1, 2, 4 segments per fragment,
documents shorter than a chunk and documents spanning 3+ ranks, initial and final states; and
bitwise reproducible run to run; within the gate with TF32 on for fp32 matmuls. A call after the
first reads nothing from the device (torch's sync debug mode), a disagreement between ranks
poisons and raises at check_calls, and a call captured in a CUDA graph replays the eager results.
The packs' spans are shorter than cake.kcp.plan.LONG_SPAN_ROWS, so the products are batched by
default; the in-place products of long spans are forced by lowering it (to 1 row: every span, or
64: some of each). Skipped where there is no CUDA device.
"""

import functools

import pytest
import torch
import torch.nn.functional as F

import cake
import cake.kcp as kcp
from cake.kcp import plan
from test_kcp import PER_TOKEN, TIMEOUT, _assemble, _kcp_rank

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

K = V = 128
PACKS = {
    "short_and_long": [0, 5, 17, 64, 65, 900, 963, 1000],  # < a chunk, chunk edges, spans ranks
    "one_long": [0, 1500],                                # a document across every rank
}


def make_inputs(cu, H, HV, kda, seed):
    """bf16 q, k, v (q, k L2-normalised in the op), float32 g (per channel for KDA) and beta,
    float32 initial states; on the GPU, as leaves."""
    gen = torch.Generator().manual_seed(seed)
    T, N = cu[-1], len(cu) - 1
    t = dict(q=torch.randn(1, T, H, K, generator=gen).bfloat16(),
             k=torch.randn(1, T, H, K, generator=gen).bfloat16(),
             v=torch.randn(1, T, HV, V, generator=gen).bfloat16(),
             g=F.logsigmoid(torch.randn((1, T, HV, K) if kda else (1, T, HV), generator=gen) + 3),
             beta=0.2 * torch.rand(1, T, HV, generator=gen),
             initial_state=torch.randn(N, HV, K, V, generator=gen))
    t = {n: x.cuda().requires_grad_() for n, x in t.items()}
    t["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device="cuda")
    return t


def fp64_reference(kda, t, do, dht):
    """The single-rank op on the CPU (the FP64 reference) on the upcast inputs."""
    x = {n: v.detach().double().cpu().requires_grad_() for n, v in t.items() if n != "cu_seqlens"}
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
               output_final_state=True, use_qk_l2norm_in_kernel=True,
               cu_seqlens=t["cu_seqlens"].cpu())
    torch.autograd.backward([o, ht], [do.double().cpu(), dht.double().cpu()])
    return o.detach(), ht.detach(), {n: x[n].grad for n in PER_TOKEN + ("initial_state",)}


def within_gate(got, want, what):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = got - want
    rel_rms = (err.norm() / want.norm().clamp_min(1e-30)).item()
    max_abs = err.abs().max().item()
    assert rel_rms <= 1e-2 and max_abs <= 2e-2 * want.abs().max().item(), (
        f"{what}: rel_rms {rel_rms:.2e}, max_abs {max_abs:.2e}")


def run_kcp(kda, t, W, layout, P, do, dht):
    opts = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    world = kcp.VirtualWorld(W, timeout=TIMEOUT)
    return world.run(lambda ex: _kcp_rank(ex, kda, t, opts, layout, P, do, dht))


def ranks_within_gate(ranks, t, o, ht, want):
    """Every rank's outputs and gradients, assembled, against the FP64 reference."""
    within_gate(_assemble([(r[0], r[1]) for r in ranks], o.to(ranks[0][1])), o, "o")
    within_gate(sum(r[2] for r in ranks), ht, "final_state")
    for n in PER_TOKEN:
        got = _assemble([(r[0], r[3][n]) for r in ranks], t[n].detach())
        within_gate(got, want[n], f"d{n}")
    within_gate(sum(r[4]["initial_state"] for r in ranks), want["initial_state"], "dh0")


@functools.lru_cache(maxsize=None)
def case(kda, pack):
    """The inputs, cotangents and FP64 reference of one pack (shared by every W, layout and P, so
    that the reference runs once per pack and variant)."""
    cu = PACKS[pack]
    t = make_inputs(cu, 2, 4, kda, seed=len(cu) + kda)
    gen = torch.Generator().manual_seed(5)
    T, N, HV = cu[-1], len(cu) - 1, 4
    do = torch.randn(1, T, HV, V, generator=gen).bfloat16().cuda()
    dht = torch.randn(N, HV, K, V, generator=gen).cuda()
    return t, do, dht, fp64_reference(kda, t, do, dht)


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("layout", kcp.LAYOUTS)
@pytest.mark.parametrize("W", [2, 3, 4, 8])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_on_cuda_within_the_gate(kda, W, layout, P):
    t, do, dht, (o, ht, want) = case(kda, "short_and_long" if W % 2 == 0 else "one_long")
    ranks = run_kcp(kda, t, W, layout, P, do, dht)
    ranks_within_gate(ranks, t, o, ht, want)


@pytest.mark.parametrize("long_rows", [1, 64])
@pytest.mark.parametrize("W, layout, P", [(4, "zigzag_per_document", 2), (3, "contiguous", 1),
                                          (8, "zigzag", 4)])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_in_place_products_on_cuda_within_the_gate(kda, W, layout, P, long_rows,
                                                        monkeypatch):
    monkeypatch.setattr(plan, "LONG_SPAN_ROWS", long_rows)
    t, do, dht, (o, ht, want) = case(kda, "short_and_long" if W % 2 == 0 else "one_long")
    ranks = run_kcp(kda, t, W, layout, P, do, dht)
    ranks_within_gate(ranks, t, o, ht, want)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_on_cuda_within_the_gate_with_tf32_on(kda):
    """Training scripts often turn TF32 on for every fp32 matmul; the state products of the
    composition (fp32 M S + B) then run in TF32. The composition must still pass the gate at the
    most segments and ranks the suite uses."""
    t, do, dht, (o, ht, want) = case(kda, "short_and_long")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        ranks = run_kcp(kda, t, 8, "zigzag", 4, do, dht)
    finally:
        torch.set_float32_matmul_precision(before)
    ranks_within_gate(ranks, t, o, ht, want)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_on_cuda_is_reproducible(kda):
    cu = PACKS["short_and_long"]
    t = make_inputs(cu, 2, 4, kda, seed=3)
    gen = torch.Generator().manual_seed(6)
    do = torch.randn(1, cu[-1], 4, V, generator=gen).bfloat16().cuda()
    dht = torch.randn(len(cu) - 1, 4, K, V, generator=gen).cuda()
    first = run_kcp(kda, t, 4, "zigzag", 2, do, dht)
    again = run_kcp(kda, t, 4, "zigzag", 2, do, dht)
    for a, b in zip(first, again):
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        for n in PER_TOKEN:
            assert torch.equal(a[3][n], b[3][n]), f"d{n} differs between runs"


def _call(kda, t, ctx, **kwargs):
    """One rank's KCP forward and backward on CUDA tensors: (o, final state, local grads)."""
    local = {n: kcp.shard(t[n].detach(), ctx).requires_grad_() for n in PER_TOKEN}
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
    o, ht = fn(*(local[n] for n in PER_TOKEN), ctx, initial_state=t["initial_state"].detach(),
               output_final_state=True, use_qk_l2norm_in_kernel=True, **kwargs)
    (o.float().square().sum() + ht.square().sum()).backward()
    return o.detach(), ht.detach(), {n: x.grad for n, x in local.items()}


@pytest.mark.parametrize("long_rows", [plan.LONG_SPAN_ROWS, 1], ids=["batched", "in_place"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_later_calls_read_nothing_from_the_device(kda, long_rows, monkeypatch):
    """Once a context's first call has agreed the sizes and built the call plan, a forward and
    backward on 4 virtual ranks make no device-to-host synchronisation (torch's sync debug mode
    raises on one) and give the first call's results bitwise."""
    import threading

    monkeypatch.setattr(plan, "LONG_SPAN_ROWS", long_rows)

    cu = PACKS["short_and_long"]
    t = make_inputs(cu, 2, 4, kda, seed=8)
    W = 4
    barrier = threading.Barrier(W)

    def body(ex):
        ctx = kcp.build_context(t["cu_seqlens"], exchange=ex, layout="zigzag_per_document",
                                segments=2)
        first = _call(kda, t, ctx)
        torch.cuda.synchronize()
        barrier.wait()
        if ex.rank == 0:
            torch.cuda.set_sync_debug_mode("error")
        barrier.wait()
        try:
            again = _call(kda, t, ctx)
        finally:
            barrier.wait()
            if ex.rank == 0:
                torch.cuda.set_sync_debug_mode("default")
            barrier.wait()  # the mode is the process's: no rank reads the device before this
        kcp.check_calls(ctx)
        return first, again

    for first, again in kcp.VirtualWorld(W, timeout=TIMEOUT).run(body):
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
        for n in PER_TOKEN:
            assert torch.equal(first[2][n], again[2][n]), f"d{n} differs"


def test_kcp_disagreement_on_cuda_poisons_and_raises_at_check():
    """A later call whose scale differs on one rank: the received states are NaN on every rank
    (no host read in the call), and check_calls raises ValueError on every rank."""
    cu = PACKS["one_long"]
    t = make_inputs(cu, 2, 4, False, seed=9)

    def body(ex):
        ctx = kcp.build_context(t["cu_seqlens"], exchange=ex, layout="contiguous")
        _call(False, t, ctx)
        o, _, _ = _call(False, t, ctx, scale=0.05 if ex.rank == 1 else None)
        nan = bool(o.isnan().any())
        try:
            kcp.check_calls(ctx)
        except ValueError as e:
            return nan, str(e)
        return nan, None

    for r, (nan, error) in enumerate(kcp.VirtualWorld(2, timeout=TIMEOUT).run(body)):
        assert error is not None and "disagree on scale" in error, f"rank {r}: {error}"
        if r == 1:  # rank 1 receives rank 0's state; rank 0 receives none in this layout
            assert nan, "rank 1's states from the disagreeing call must be NaN"


@pytest.mark.parametrize("long_rows", [plan.LONG_SPAN_ROWS, 1], ids=["batched", "in_place"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_kcp_graph_replays_eager(kda, long_rows, monkeypatch):
    """A one-rank context with 3 segments per document (summaries, compositions and the walks
    all in the call): forward and backward captured in a CUDA graph replay the eager results
    bitwise."""
    from test_gpu_gdn import check_graph_replays_eager

    monkeypatch.setattr(plan, "LONG_SPAN_ROWS", long_rows)

    cu = [0, 900, 1000]
    t = make_inputs(cu, 2, 4, kda, seed=10)
    ctx = kcp.build_context(t["cu_seqlens"], segments=3)
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp

    def op(q, k, v, g, beta, *, cu_seqlens, save_for_backward, **kwargs):
        return fn(q, k, v, g, beta, ctx, **kwargs)

    inputs = {n: t[n].detach() for n in PER_TOKEN + ("initial_state",)}
    inputs["cu_seqlens"] = t["cu_seqlens"]
    gen = torch.Generator().manual_seed(11)
    dout = torch.randn(1, cu[-1], 4, V, generator=gen).bfloat16()
    dht = torch.randn(len(cu) - 1, 4, K, V, generator=gen)
    check_graph_replays_eager(op, inputs, dout, dht, None)
