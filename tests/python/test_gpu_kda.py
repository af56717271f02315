"""KDA on the GPU against the FP64 reference (cake's own CPU path on the same inputs, upcast).

Accuracy gate (bench/workloads.json): for o, the final state and every gradient, relative RMS
error <= 1e-2 and max-abs error <= 2e-2 x max|ref|, all finite, into buffers poisoned with NaN
(through cake.abi directly), on the cases the KDA design asks for: bounded gates (down to -5 per
token and channel), unbounded ones (logsigmoid(N(0, 1)), some down to -20), g = 0 and -20 on
alternate channels of one token, beta near 0 and 1, documents of 1, 15, 16, 17, 63, 64, 65, many
short and one long, GVA ratios 1, 3 and 4. Also: the modes bitwise equal, determinism across runs
and streams, CUDA-graph replay equal to eager, exact buffers. Skipped where there is no CUDA device.
"""

import zlib

import pytest
import torch
import torch.nn.functional as F

import cake
from cake import abi, ops
from test_gpu_gdn import OPTIONS, check_gate, guarded, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

K = V = 128
MODES = ops.SAVE_MODES


def gate(kind, shape, gen):
    """g [1, T, HV, K] of one kind (the KDA design's adversarial gates)."""
    if kind == "bounded":
        return -5.0 * torch.rand(shape, generator=gen)
    if kind == "unbounded":  # logsigmoid(N(0, 1)), one value in 16 down to -20 .. -10
        g = F.logsigmoid(torch.randn(shape, generator=gen))
        strong = torch.rand(shape, generator=gen) < 1 / 16
        return torch.where(strong, -10.0 - 10.0 * torch.rand(shape, generator=gen), g)
    if kind == "split":  # 0 on even channels, -20 on odd ones, in every token
        g = torch.zeros(shape)
        g[..., 1::2] = -20.0
        return g
    if kind == "zero":
        return torch.zeros(shape)
    return -torch.rand(shape, generator=gen)  # "mild": U(-1, 0)


def make_inputs(docs, H, HV, *, seed, gate_kind="mild", beta_range=(0.05, 0.95),
                initial_state=True):
    """bf16 q, k, v; float32 g [1, T, HV, K] and beta; a packed batch of the documents."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(docs), len(docs)
    q = torch.randn(1, T, H, K, generator=gen).bfloat16()
    k = torch.randn(1, T, H, K, generator=gen).bfloat16()
    v = torch.randn(1, T, HV, V, generator=gen).bfloat16()
    g = gate(gate_kind, (1, T, HV, K), gen)
    lo, hi = beta_range
    beta = lo + (hi - lo) * torch.rand(1, T, HV, generator=gen)
    h0 = torch.randn(N, HV, K, V, generator=gen) if initial_state else None
    cu = torch.tensor([0] + list(docs)).cumsum(0).to(torch.int32)
    dout = torch.randn(1, T, HV, V, generator=gen).bfloat16()
    dht = torch.randn(N, HV, K, V, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu), dout, dht


def reference(inputs, dout, dht):
    """o, final_state and every gradient from the FP64 CPU reference on the upcast inputs."""
    x = {name: None if t is None else t.double().requires_grad_(t.is_floating_point())
         for name, t in inputs.items()}
    x["cu_seqlens"] = inputs["cu_seqlens"]
    o, ht = cake.chunk_kda(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])
    torch.autograd.backward([o, ht], [dout.double(), dht.double()])
    grads = {"d" + n: x[n].grad for n in ("q", "k", "v", "g", "beta")}
    if x["initial_state"] is not None:
        grads["dh0"] = x["initial_state"].grad
    return {"o": o.detach(), "final_state": ht.detach(), **grads}


def run_gpu(inputs, dout, dht, stream=None, mode="recompute"):
    """Forward and backward through cake.abi into NaN-poisoned buffers (the saved set poisoned
    with 0xFF bytes); returns every result on the CPU."""
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    T, HV, N = x["q"].shape[1], x["v"].shape[2], x["cu_seqlens"].numel() - 1
    stream = stream or torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    o = torch.full((1, T, HV, V), float("nan"), dtype=torch.bfloat16, device="cuda")
    ht = torch.full((N, HV, K, V), float("nan"), device="cuda")
    ins = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"], None,
           None)
    opts = (ops.KDA, K ** -0.5, True, *OPTIONS.values(), MODES[mode])
    with torch.cuda.stream(stream):
        nbytes = abi.forward_saved_size(*ins, o, ht, *opts)
        saved = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
        nbytes = abi.forward_workspace_size(*ins, o, ht, *opts)
        ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda") if nbytes else None
        abi.forward(*ins, o, ht, *opts, saved, ws, stream.cuda_stream)
        grads = {"d" + n: poisoned(x[n]) for n in ("q", "k", "v", "g", "beta")}
        grads["dh0"] = poisoned(x["initial_state"]) if x["initial_state"] is not None else None
        bargs = (*ins, dout.cuda(), dht.cuda(), grads["dq"], grads["dk"], grads["dv"], grads["dg"],
                 grads["dbeta"], grads["dh0"], None, None)
        nbytes = abi.backward_workspace_size(*bargs, *opts)
        ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda") if nbytes else None
        abi.backward(*bargs, *opts, saved, ws, stream.cuda_stream)
    stream.synchronize()
    out = {"o": o, "final_state": ht, **grads}
    return {n: t.cpu() for n, t in out.items() if t is not None}


CASES = {
    # name: (docs, H, HV, make_inputs keywords)
    "edges_gva1": ([1, 15, 16, 17, 63, 64, 65, 1000], 2, 2, {}),
    "bounded_gva3": ([300, 129], 2, 6, dict(gate_kind="bounded")),
    "unbounded_gva4": ([65, 700], 1, 4, dict(gate_kind="unbounded")),
    "split_channels": ([130, 65], 2, 4, dict(gate_kind="split")),
    "decay_zero": ([65, 200], 2, 4, dict(gate_kind="zero")),
    "beta_near_0": ([130], 1, 2, dict(beta_range=(1e-4, 2e-4))),
    "beta_near_1": ([130], 1, 2, dict(beta_range=(1 - 2e-4, 1 - 1e-4))),
    "no_state": ([300, 129], 4, 4, dict(initial_state=False)),
    "empty_documents": ([0, 65, 0, 1], 1, 2, {}),
    "many_short_one_long": ([1 + 6 * (i % 20) for i in range(40)] + [3000], 2, 4, {}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_accuracy(case, mode):
    docs, H, HV, kw = CASES[case]
    inputs, dout, dht = make_inputs(docs, H, HV, seed=zlib.crc32(case.encode()), **kw)
    check_gate(run_gpu(inputs, dout, dht, mode=mode), reference(inputs, dout, dht),
               f"kda {case} {mode}")


@pytest.mark.slow
def test_accuracy_one_64k_document():
    inputs, dout, dht = make_inputs([65536], 1, 2, seed=7, gate_kind="unbounded")
    check_gate(run_gpu(inputs, dout, dht), reference(inputs, dout, dht), "kda 64K_doc")


def test_modes_agree_bitwise():
    inputs, dout, dht = make_inputs([1, 63, 64, 65, 1000], 2, 6, seed=23)
    recompute = run_gpu(inputs, dout, dht, mode="recompute")
    for mode in ("saved", "inverse"):
        other = run_gpu(inputs, dout, dht, mode=mode)
        for name, t in recompute.items():
            assert torch.equal(t, other[name]), f"{name} differs between {mode} and recompute"


@pytest.mark.parametrize("mode", MODES)
def test_deterministic_across_runs_and_streams(mode):
    inputs, dout, dht = make_inputs([1000, 2000, 77], 2, 6, seed=11, gate_kind="unbounded")
    results = [run_gpu(inputs, dout, dht, stream=torch.cuda.Stream(), mode=mode)
               for _ in range(3)]
    for other in results[1:]:
        for name, t in results[0].items():
            assert torch.equal(t, other[name]), f"{name} differs between runs"


@pytest.mark.parametrize("mode", MODES)
def test_graph_capture_replays_eager_results(mode):
    inputs, dout, dht = make_inputs([700, 300], 2, 4, seed=13)
    x = {n: None if t is None else t.cuda().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    x["cu_seqlens"] = inputs["cu_seqlens"].cuda()
    dout, dht = dout.cuda(), dht.cuda()

    def step():
        for t in x.values():
            if t is not None:
                t.grad = None
        o, ht = cake.chunk_kda(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"],
            save_for_backward=mode)
        torch.autograd.backward([o, ht], [dout, dht])
        return [o.detach().clone(), ht.detach().clone()] + [
            x[n].grad.clone() for n in ("q", "k", "v", "g", "beta", "initial_state")]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_buffers_are_exact(mode):
    """No byte written past the queried workspace and saved set; the saved set only in saved mode
    (docs/design/kda-hopper.md); the backward never writes the saved set."""
    inputs, dout, dht = make_inputs([129, 64], 2, 4, seed=17)
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    ins = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"], None,
           None)
    o = torch.empty(1, 193, 4, V, dtype=torch.bfloat16, device="cuda")
    ht = torch.empty(2, 4, K, V, device="cuda")
    opts = (ops.KDA, K ** -0.5, True, *OPTIONS.values(), MODES[mode])
    stream = torch.cuda.current_stream().cuda_stream
    saved_bytes = abi.forward_saved_size(*ins, o, ht, *opts)
    assert (saved_bytes > 0) == (mode == "saved")
    saved_whole, saved = guarded(saved_bytes)
    nbytes = abi.forward_workspace_size(*ins, o, ht, *opts)
    ws_whole, ws = guarded(nbytes)
    abi.forward(*ins, o, ht, *opts, saved, ws, stream)
    torch.cuda.synchronize()
    assert (ws_whole[nbytes:] == 0xA5).all(), "the forward wrote past its workspace"
    assert (saved_whole[saved_bytes:] == 0xA5).all(), "the forward wrote past its saved set"
    grads = [torch.empty_like(x[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")]
    bargs = (*ins, dout.cuda(), dht.cuda(), *grads, None, None)
    saved_before = saved_whole.clone()
    nbytes = abi.backward_workspace_size(*bargs, *opts)
    ws_whole, ws = guarded(nbytes)
    abi.backward(*bargs, *opts, saved, ws, stream)
    torch.cuda.synchronize()
    assert (ws_whole[nbytes:] == 0xA5).all(), "the backward wrote past its workspace"
    assert torch.equal(saved_whole, saved_before), "the backward wrote to the saved set"


@pytest.mark.parametrize("variant", ["gdn", "kda"])
@pytest.mark.parametrize("lower_bound", [None, -3.0], ids=["softplus", "lower_bound"])
def test_in_op_gate_and_beta_sigmoid_on_cuda(variant, lower_bound):
    """use_gate_in_kernel (A_log, dt_bias; KDA also with lower_bound) and
    use_beta_sigmoid_in_kernel with allow_neg_eigval on CUDA (computed in torch before the
    kernels, cake/gate.py) against the same call on the CPU reference (computed in the op):
    o, the final state and every gradient, dA_log and ddt_bias included, within the gate."""
    kda = variant == "kda"
    if lower_bound is not None and not kda:
        pytest.skip("lower_bound is KDA's")
    gen = torch.Generator().manual_seed(31)
    docs, H, HV = [65, 300, 1], 2, 4
    T, N = sum(docs), len(docs)
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T, H, K, generator=gen),
             v=torch.randn(1, T, HV, V, generator=gen),
             g=torch.randn((1, T, HV, K) if kda else (1, T, HV), generator=gen),
             beta=torch.randn(1, T, HV, generator=gen),
             initial_state=torch.randn(N, HV, K, V, generator=gen),
             A_log=torch.rand(HV, generator=gen), dt_bias=torch.randn(HV * K if kda else HV,
                                                                      generator=gen))
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    extra = dict(lower_bound=lower_bound) if kda else {}

    def run(device, dtype):
        leaves = {n: (t.to(dtype) if n in ("q", "k", "v") else t.double() if dtype == torch.float64
                      else t).to(device).requires_grad_() for n, t in x.items()}
        o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                   initial_state=leaves["initial_state"], output_final_state=True,
                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                   use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                   A_log=leaves["A_log"], dt_bias=leaves["dt_bias"], cu_seqlens=cu.to(device),
                   **extra)
        torch.autograd.backward([o, ht], [do.to(device, o.dtype), dht.to(device, ht.dtype)])
        return {"o": o.detach().cpu(), "final_state": ht.detach().cpu(),
                **{"d" + n: t.grad.cpu() for n, t in leaves.items()}}

    check_gate(run("cuda", torch.bfloat16), run("cpu", torch.float64), f"{variant} in-op gate")

