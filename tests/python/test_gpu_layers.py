"""cake.layers on the GPU: against flash-linear-attention 0.6.0's own layers with the same state
dict, the save_for_backward modes, exact segments from host offsets, torch.compile, KDA's layer
on CUDA against itself with the op in FP64, CUDA-graph capture of a whole training step, and the
layers on virtual ranks with cp_context. Skipped where there is no CUDA device (and the FLA comparison where FLA is not
installed).

Accuracy gate (bench/workloads.json): rel-RMS error <= 1e-2, max-abs error <= 2e-2 x max|ref|,
all finite; the reference is FLA's layer in the same precision (bf16 autocast), the same layer
with the FP64 op, or the layer on the whole pack.
"""

import copy

import pytest
import torch

import cake
import cake.layers.kda
from cake.layers import GatedDeltaNet, KimiDeltaAttention
from test_layers import assert_within_gate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# The shapes cake's kernels take: K = V = 128 (expand_v = 1), grouped value heads.
CONFIG = dict(hidden_size=512, head_dim=128, num_heads=2, num_v_heads=4, expand_v=1)
DOCS = [700, 1, 300, 1023]


def packed_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(DOCS)
    x = torch.randn(1, T, CONFIG["hidden_size"], generator=gen).cuda()
    cu = torch.tensor([0] + DOCS).cumsum(0).to(torch.int32).cuda()
    return x, cu


def gdn(seed=0, **extra):
    torch.manual_seed(seed)
    return GatedDeltaNet(**CONFIG, **extra).cuda()


def forward_backward(layer, x, cu):
    """{"o", "dx" and each parameter's name: its gradient} of sum(o^2)/T under bf16 autocast
    (by name: FLA's layers register their parameters in another order)."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = layer(x, cu_seqlens=cu)[0]
    (o.float().square().sum() / x.shape[1]).backward()
    return {"o": o.detach(), "dx": x.grad, **{n: p.grad for n, p in layer.named_parameters()}}


def test_gdn_matches_flas_layer():
    fla = pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    ours = gdn()
    theirs = fla.GatedDeltaNet(**CONFIG).cuda()
    theirs.load_state_dict(ours.state_dict())
    x, cu = packed_batch()
    got, want = forward_backward(ours, x, cu), forward_backward(theirs, x, cu)
    assert got.keys() == want.keys()
    for name in want:
        assert_within_gate(got[name], want[name], name)


def test_kda_on_cpu_matches_flas_layer_on_gpu():
    """cake's KDA CPU layer (the FP64 reference) against FLA's layer on the GPU, in float32, with
    the same weights: output and every gradient within the gate."""
    fla = pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    config = dict(hidden_size=256, head_dim=64, num_heads=2, num_v_heads=4)
    torch.manual_seed(6)
    ours = KimiDeltaAttention(**config)
    theirs = fla.KimiDeltaAttention(**config).cuda()
    theirs.load_state_dict(ours.state_dict())
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 501, 256, generator=gen)
    cu = torch.tensor([0, 300, 301, 501], dtype=torch.int32)

    def run(layer, device):
        xd = x.detach().to(device).requires_grad_()  # a leaf of its own on either device
        o = layer(xd, cu_seqlens=cu.to(device))[0]
        o.square().sum().backward()
        return {"o": o.detach().cpu(), "dx": xd.grad.cpu(),
                **{n: p.grad.cpu() for n, p in layer.named_parameters()}}

    got, want = run(ours, "cpu"), run(theirs, "cuda")
    assert got.keys() == want.keys()
    for name in want:
        assert_within_gate(got[name], want[name], name)


@pytest.mark.parametrize("mode", ["saved", "inverse", "recompute"])
def test_save_for_backward_modes_agree_bitwise(mode):
    x, cu = packed_batch(1)
    want = forward_backward(gdn(save_for_backward="recompute"), x, cu)
    got = forward_backward(gdn(save_for_backward=mode), x, cu)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_gdn_layer_with_host_offsets_walks_segments_within_the_gate(monkeypatch):
    """The main job's --cu-seqlens-cpu: few long documents at few value heads, given their host
    offsets, take the exact segments (cake.segments) inside the layer; the output and every
    gradient stay within the gate of the same layer without them."""
    from conftest import record_segment_routes
    routed = record_segment_routes(monkeypatch)
    docs = [5000, 4100, 3000]  # 12 walks at 4 value heads on the GPU's SMs: the plan cuts
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, sum(docs), CONFIG["hidden_size"], generator=gen).cuda()
    cu_cpu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    layer = gdn(4)
    want = forward_backward(layer, x, cu_cpu.cuda())
    assert routed == []
    layer.zero_grad(set_to_none=True)
    xs = x.detach().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = layer(xs, cu_seqlens=cu_cpu.cuda(), cu_seqlens_cpu=cu_cpu)[0]
    (o.float().square().sum() / xs.shape[1]).backward()
    got = {"o": o.detach(), "dx": xs.grad, **{n: p.grad for n, p in layer.named_parameters()}}
    assert routed == ["chunk_gated_delta_rule"]
    for name in want:
        assert_within_gate(got[name], want[name], name)


def test_saved_mode_keeps_more_than_recompute():
    """What the forward keeps for the backward: "saved" holds more than "recompute"."""
    x, cu = packed_batch(2)

    def kept(mode):
        layer = gdn(save_for_backward=mode)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = layer(x.requires_grad_(), cu_seqlens=cu)[0]
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        del o
        return held

    assert kept("saved") > kept("recompute")


def test_compile_gdn_matches_eager():
    x, cu = packed_batch(3)
    layer = gdn()
    eager = forward_backward(layer, x, cu)
    layer.compile(fullgraph=True)  # in place: the parameters keep their names
    got = forward_backward(layer, x, cu)
    for name in eager:
        assert_within_gate(got[name], eager[name], f"compiled {name}")


def chunk_kda_in_fp64(q, k, v, g, beta, *, cu_seqlens=None, A_log=None, dt_bias=None, **opts):
    """cake.chunk_kda computed by the FP64 reference on the CPU, differentiable, its output back
    on q's device in q's dtype (as the kernels return it)."""
    def cpu(x):
        return None if x is None else x.cpu().double()

    o, ht = cake.chunk_kda(cpu(q), cpu(k), cpu(v), cpu(g), cpu(beta), A_log=cpu(A_log),
                           dt_bias=cpu(dt_bias),
                           cu_seqlens=None if cu_seqlens is None else cu_seqlens.cpu(), **opts)
    return o.to(q.device, q.dtype), ht


def test_kda_layer_on_cuda_matches_the_fp64_op(monkeypatch):
    """The KDA layer on CUDA under bf16 autocast (the gate and beta's sigmoid in torch, the op's
    kernels) against the same layer, same weights and batch, whose op alone is the FP64 reference
    (everything around the op the same GPU computation): the output and every gradient within
    the gate, so that what differs is the kernels' error as the layer propagates it."""
    torch.manual_seed(7)
    layer = KimiDeltaAttention(hidden_size=256, head_dim=128, num_heads=2, num_v_heads=4).cuda()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1, 300, 256, generator=gen).cuda()
    cu = torch.tensor([0, 64, 65, 300], dtype=torch.int32).cuda()

    def run():
        layer.zero_grad(set_to_none=True)
        xd = x.detach().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = layer(xd, cu_seqlens=cu)[0]
        o.float().square().sum().backward()
        return {"o": o.detach().float(), "dx": xd.grad,
                **{n: p.grad for n, p in layer.named_parameters()}}

    got = run()
    monkeypatch.setattr(cake.layers.kda, "chunk_kda", chunk_kda_in_fp64)
    want = run()
    for name in want:
        assert_within_gate(got[name], want[name], name)


def test_graph_capture_of_a_training_step_replays_eager():
    """A whole step (forward, backward, AdamW) of a layer captured in a CUDA graph: after the
    same steps from the same weights on the same batch, replay and eager agree bitwise."""
    x, cu = packed_batch(4)
    eager_layer, graph_layer = gdn(seed=5), gdn(seed=5)

    def make_step(layer):
        optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3, capturable=True)

        def step():
            optimizer.zero_grad(set_to_none=False)
            # No autocast cache: a cast cached outside the capture would be a stale input to it.
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                o = layer(x, cu_seqlens=cu)[0]
            o.float().square().mean().backward()
            optimizer.step()
        return step

    eager_step, graph_step = make_step(eager_layer), make_step(graph_layer)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: allocates the gradients and AdamW's state
            graph_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_step()  # captured, not run: the weights are still after 2 steps
    for _ in range(2):
        eager_step()
    for _ in range(3):
        graph.replay()
        eager_step()
    torch.cuda.synchronize()
    for (name, a), b in zip(eager_layer.named_parameters(), graph_layer.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
def test_context_parallel_layer_on_cuda_matches_single_rank(cls):
    """The layer on 4 virtual ranks' shards with cp_context (the halo and the states passed
    between ranks) against the same layer on the whole pack, under bf16 autocast: outputs and x
    gradients per token, parameter gradients summed over ranks, within the accuracy gate."""
    import cake.kcp as kcp

    torch.manual_seed(0)
    layer = cls(**CONFIG).cuda()
    x, cu = packed_batch()
    want = forward_backward(layer, x, cu)

    def rank(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout="zigzag_per_document")
        mine = copy.deepcopy(layer)
        mine.zero_grad(set_to_none=True)
        x_local = kcp.shard(x, ctx).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = mine(x_local, cp_context=ctx)[0]
        (o.float().square().sum() / x.shape[1]).backward()
        return (kcp.unshard(o.detach(), ctx), kcp.unshard(x_local.grad, ctx),
                {n: p.grad for n, p in mine.named_parameters()})

    ranks = kcp.VirtualWorld(4, timeout=120.0).run(rank)
    assert_within_gate(ranks[0][0], want["o"], "o")
    assert_within_gate(ranks[0][1], want["dx"], "dx")
    for n, _ in layer.named_parameters():
        assert_within_gate(sum(r[2][n] for r in ranks), want[n], f"d{n} summed over ranks")
