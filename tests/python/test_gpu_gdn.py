"""GDN on the GPU against the FP64 reference (cake's own CPU path on the same inputs, upcast).

Accuracy gate (bench/workloads.json): for o and every gradient, relative RMS error <= 1e-2
and max-abs error <= 2e-2 x max|ref|, all finite. Outputs and gradients are written into buffers
poisoned with NaN, through cake.abi directly, so that an element the kernels never write fails.
Skipped where there is no CUDA device.
"""

import zlib

import pytest
import torch

import cake
from cake import abi, ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

K = V = 128
OPTIONS = dict(use_gate_in_kernel=False, lower_bound=None, use_beta_sigmoid=False,
               allow_neg_eigval=False)
MODES = ops.SAVE_MODES  # options.save_for_backward of each mode


def make_inputs(docs, H, HV, *, seed, g_range=(-1.0, 0.0), beta_range=(0.05, 0.95),
                initial_state=True, beta_dtype=torch.float32):
    """bf16 q, k, v; float32 g, beta; a packed batch of documents of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(docs), len(docs)
    q = torch.randn(1, T, H, K, generator=gen).bfloat16()
    k = torch.randn(1, T, H, K, generator=gen).bfloat16()
    v = torch.randn(1, T, HV, V, generator=gen).bfloat16()
    lo, hi = g_range
    g = lo + (hi - lo) * torch.rand(1, T, HV, generator=gen)
    lo, hi = beta_range
    beta = (lo + (hi - lo) * torch.rand(1, T, HV, generator=gen)).to(beta_dtype)
    h0 = torch.randn(N, HV, K, V, generator=gen) if initial_state else None
    cu = torch.tensor([0] + list(docs)).cumsum(0).to(torch.int32)
    dout = torch.randn(1, T, HV, V, generator=gen).bfloat16()
    dht = torch.randn(N, HV, K, V, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu), dout, dht


def unit_norm_qk(inputs):
    """q and k normalised in place, as the op expects of its callers without the in-kernel norm."""
    for name in ("q", "k"):
        inputs[name] = torch.nn.functional.normalize(inputs[name].float(), dim=-1).bfloat16()


def reference(inputs, dout, dht, use_qk_l2norm, variant=ops.GDN):
    """o, final_state and every gradient from the FP64 CPU reference on the upcast inputs."""
    op = cake.chunk_kda if variant == ops.KDA else cake.chunk_gated_delta_rule
    x = {name: None if t is None else t.double().requires_grad_(t.is_floating_point())
         for name, t in inputs.items()}
    x["cu_seqlens"] = inputs["cu_seqlens"]
    o, ht = op(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
        output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=x["cu_seqlens"])
    torch.autograd.backward([o, ht], [dout.double(), dht.double()])
    grads = {"d" + n: x[n].grad for n in ("q", "k", "v", "g", "beta")}
    if x["initial_state"] is not None:
        grads["dh0"] = x["initial_state"].grad
    return {"o": o.detach(), "final_state": ht.detach(), **grads}


def poisoned(t):
    return torch.full_like(t, float("nan"), device="cuda")


def run_gpu(inputs, dout, dht, use_qk_l2norm, stream=None, mode="recompute", absent=(),
            variant=ops.GDN, unordered_sums=False):
    """Forward and backward through cake.abi into NaN-poisoned buffers; returns every result.

    In saved and inverse modes the forward writes the saved set (a buffer poisoned with 0xFF bytes,
    so that a region the backward reads but the forward never wrote shows) and the backward reads
    it.
    absent: names of gradients ("dv", ...) the backward is not asked for (passed as None).
    Workspaces are poisoned with 0xFF bytes too: nothing may rely on their contents.
    """
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    q = x["q"]
    T, HV, N = q.shape[1], x["v"].shape[2], x["cu_seqlens"].numel() - 1
    stream = stream or torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())  # the copies above ran on the current stream
    o = torch.full((1, T, HV, V), float("nan"), dtype=torch.bfloat16, device="cuda")
    ht = torch.full((N, HV, K, V), float("nan"), device="cuda")
    ins = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"], None,
           None)
    opts = (variant, K ** -0.5, use_qk_l2norm, *OPTIONS.values(), MODES[mode], unordered_sums)
    with torch.cuda.stream(stream):
        nbytes = abi.forward_saved_size(*ins, o, ht, *opts)  # 0 in recompute mode
        saved = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
        nbytes = abi.forward_workspace_size(*ins, o, ht, *opts)
        ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
        abi.forward(*ins, o, ht, *opts, saved, ws, stream.cuda_stream)
        grads = {"d" + n: poisoned(x[n]) for n in ("q", "k", "v", "g", "beta")}
        grads["dh0"] = poisoned(x["initial_state"]) if x["initial_state"] is not None else None
        grads.update({n: None for n in absent})
        bargs = (*ins, dout.cuda(), dht.cuda(), grads["dq"], grads["dk"], grads["dv"], grads["dg"],
                 grads["dbeta"], grads["dh0"], None, None)
        nbytes = abi.backward_workspace_size(*bargs, *opts)
        ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
        abi.backward(*bargs, *opts, saved, ws, stream.cuda_stream)
    stream.synchronize()
    out = {"o": o, "final_state": ht, **grads}
    return {n: t.cpu() for n, t in out.items() if t is not None}


def check_gate(gpu, ref, label):
    rows = []
    for name, r in ref.items():
        got = gpu[name].double()
        r = r.double()
        assert torch.isfinite(got).all(), f"{label}: {name} has non-finite (unwritten?) elements"
        err = got - r
        rel_rms = (err.norm() / r.norm().clamp_min(1e-30)).item()
        max_abs = err.abs().max().item()
        bound = 2e-2 * r.abs().max().item()
        rows.append(f"{label:28s} {name:12s} rel_rms {rel_rms:.2e}  max_abs {max_abs:.2e}"
                    f" (bound {bound:.2e})")
        assert rel_rms <= 1e-2 and max_abs <= bound, "\n".join(rows)
    print("\n".join(rows))


CASES = {
    # name: (docs, H, HV, make_inputs keywords, use_qk_l2norm)
    "edges_gva3_l2norm": ([1, 63, 64, 65, 1000], 2, 6, {}, True),
    "no_gva_no_state": ([300, 129], 4, 4, dict(initial_state=False), True),
    "decay_minus20": ([65, 200], 2, 4, dict(g_range=(-20.0, -20.0)), True),
    "decay_zero": ([65, 200], 2, 4, dict(g_range=(0.0, 0.0)), True),
    "beta_near_0": ([130], 1, 2, dict(beta_range=(1e-4, 2e-4)), True),
    "beta_near_1": ([130], 1, 2, dict(beta_range=(1 - 2e-4, 1 - 1e-4)), True),
    "beta_bf16": ([500], 2, 4, dict(beta_dtype=torch.bfloat16), True),
    "workload_N": ([2049, 3001, 3142], 2, 6, {}, True),
    # documents of no tokens: walks of no chunks (their h-walk flags still set, dh0 = dht)
    "empty_documents": ([0, 65, 0, 1], 1, 2, {}, True),
    "workload_A_scaled": ([6144, 4096, 3584, 2560], 1, 3, {}, True),
    # many short documents (lengths 1..115, each twice) and one long: 41 documents, more than the
    # 32 that the state walks rank longest first
    "many_short_one_long": ([1 + 6 * (i % 20) for i in range(40)] + [3000], 2, 4, {}, True),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_accuracy(case, mode):
    docs, H, HV, kw, l2 = CASES[case]
    inputs, dout, dht = make_inputs(docs, H, HV, seed=zlib.crc32(case.encode()), **kw)
    if not l2:
        unit_norm_qk(inputs)
    check_gate(run_gpu(inputs, dout, dht, l2, mode=mode), reference(inputs, dout, dht, l2),
               f"{case} {mode}")


SAVE_CASES = {
    # name: (docs, H, HV, use_qk_l2norm): chunk edges, GVA, with and without the saved q/k
    "edges_gva3_l2norm": ([1, 63, 64, 65, 1000], 2, 6, True),
    "no_l2norm": ([300, 129], 4, 4, False),
    "one_short_document": ([17], 1, 1, True),
}


@pytest.mark.parametrize("case", SAVE_CASES)
def test_saved_mode_equals_recompute_mode_bitwise(case):
    """The saved set holds exactly what the backward's recompute produces, and the kernels are
    deterministic: o, the final state and every gradient agree bit for bit."""
    docs, H, HV, l2 = SAVE_CASES[case]
    inputs, dout, dht = make_inputs(docs, H, HV, seed=23)
    if not l2:
        unit_norm_qk(inputs)
    recompute = run_gpu(inputs, dout, dht, l2, mode="recompute")
    for mode in ("saved", "inverse"):
        saved = run_gpu(inputs, dout, dht, l2, mode=mode)
        assert recompute.keys() == saved.keys()
        for name, t in recompute.items():
            assert torch.equal(t, saved[name]), (
                f"{case}: {name} differs between {mode} and recompute")


@pytest.mark.slow
def test_accuracy_one_long_document():
    inputs, dout, dht = make_inputs([65536], 1, 2, seed=7)
    check_gate(run_gpu(inputs, dout, dht, True), reference(inputs, dout, dht, True), "64K_doc")


@pytest.mark.parametrize("mode", MODES)
def test_deterministic_across_runs_and_streams(mode):
    inputs, dout, dht = make_inputs([1000, 2000, 77], 2, 6, seed=11)
    results = [run_gpu(inputs, dout, dht, True, stream=torch.cuda.Stream(), mode=mode)
               for _ in range(3)]
    for other in results[1:]:
        for name, t in results[0].items():
            assert torch.equal(t, other[name]), f"{name} differs between runs"


@pytest.mark.parametrize("mode", MODES)
def test_unordered_sums_pass_the_gate(mode):
    """options.unordered_sums (deterministic=False): dq and dk, summed over the value heads by adds
    in any order, pass the gate; every other output is bitwise the ordered run's (only dq and dk
    go through the sum). GVA 3 and 1 (no sum: the terms are stored)."""
    for docs, H, HV in (([1, 63, 64, 65, 1000], 2, 6), ([130, 300], 2, 2)):
        inputs, dout, dht = make_inputs(docs, H, HV, seed=31)
        ordered = run_gpu(inputs, dout, dht, True, mode=mode)
        unordered = run_gpu(inputs, dout, dht, True, mode=mode, unordered_sums=True)
        ref = reference(inputs, dout, dht, True)
        check_gate(unordered, {n: ref[n] for n in ("dq", "dk")}, f"unordered {mode} GVA {HV // H}")
        for name, t in ordered.items():
            if name not in ("dq", "dk"):
                assert torch.equal(t, unordered[name]), f"{name} differs from the ordered run's"


@pytest.mark.parametrize("absent", [("dv", "dg", "dbeta"), ("dq", "dk", "dh0")])
def test_absent_gradients(absent):
    """The C ABI takes any gradient as absent (None): the others are those of a full backward,
    bitwise, and nothing is written where a gradient is absent (no fault)."""
    inputs, dout, dht = make_inputs([300, 65, 1], 2, 6, seed=23)
    full = run_gpu(inputs, dout, dht, True)
    part = run_gpu(inputs, dout, dht, True, absent=absent)
    assert not set(absent) & set(part)
    for name, t in part.items():
        assert torch.equal(t, full[name]), f"{name} differs when {absent} are absent"


def test_int64_offsets_equal_int32_offsets():
    """FLA's callers pass int64 cu_seqlens (torch's default integer type); the kernels read both."""
    inputs, dout, dht = make_inputs([1000, 65, 1], 2, 6, seed=19)
    as_int32 = run_gpu(inputs, dout, dht, True)
    as_int64 = run_gpu(dict(inputs, cu_seqlens=inputs["cu_seqlens"].long()), dout, dht, True)
    for name, t in as_int32.items():
        assert torch.equal(t, as_int64[name]), f"{name} differs with int64 offsets"


def test_strided_offsets_equal_contiguous_offsets():
    """A cu_seqlens view with a stride (every other entry of a larger tensor) is taken as its
    contiguous copy."""
    inputs, dout, dht = make_inputs([300, 65, 1], 2, 4, seed=23)
    unit_norm_qk(inputs)  # raw randn keys (|k|^2 ~ 128) would overflow the state to NaN
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    wide = torch.zeros(2 * x["cu_seqlens"].numel(), dtype=torch.int32, device="cuda")
    wide[::2] = x["cu_seqlens"]
    outs = [cake.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        initial_state=x["initial_state"], output_final_state=True,
                                        cu_seqlens=cu)
            for cu in (x["cu_seqlens"], wide[::2])]
    assert not wide[::2].is_contiguous()
    assert all(t.isfinite().all() for t in outs[0])
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_no_tokens_pass_the_states_through(op):
    """Documents of no token (T = 0, N = 2): the final state is the initial one, dh0 is dht."""
    HV, D = 2, 128
    fn = cake.chunk_kda if op == "kda" else cake.chunk_gated_delta_rule
    q, k, v = (torch.zeros(1, 0, HV, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for _ in range(3))
    g = torch.zeros((1, 0, HV, D) if op == "kda" else (1, 0, HV), device="cuda",
                    requires_grad=True)
    beta = torch.zeros(1, 0, HV, device="cuda", requires_grad=True)
    h0 = torch.randn(2, HV, D, D, device="cuda", requires_grad=True)
    cu = torch.tensor([0, 0, 0], dtype=torch.int32, device="cuda")
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert o.shape == (1, 0, HV, D) and torch.equal(ht, h0)
    dht = torch.randn_like(ht)
    ht.backward(dht)
    assert torch.equal(h0.grad, dht)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_than_the_current_one():
    """Inputs on cuda:1 while cuda:0 is current run on cuda:1 (the op makes their device
    current), as the same call with cuda:1 current."""
    inputs, dout, dht = make_inputs([300, 65], 2, 4, seed=29)
    unit_norm_qk(inputs)
    results = []
    for current in (1, 0):
        with torch.cuda.device(current):
            x = {n: None if t is None else t.to("cuda:1") for n, t in inputs.items()}
            o, ht = cake.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                initial_state=x["initial_state"],
                                                output_final_state=True,
                                                cu_seqlens=x["cu_seqlens"])
            torch.cuda.synchronize(1)
            results.append((o, ht))
    assert all(t.isfinite().all() for t in results[0])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_graph_replays_new_offsets_of_the_same_shape():
    """A captured call replays with new cu_seqlens contents (same shape; an empty tail document as
    padding, as FLA's use_graph asks) and gives the eager results for those offsets."""
    inputs, dout, dht = make_inputs([700, 300, 0], 2, 4, seed=31)
    unit_norm_qk(inputs)
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    cu = x["cu_seqlens"].clone()

    def forward():
        return cake.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                           initial_state=x["initial_state"],
                                           output_final_state=True, cu_seqlens=cu)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward()
    cu.copy_(torch.tensor([0, 250, 1000, 1000], dtype=cu.dtype, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    eager = forward()
    assert all(t.isfinite().all() for t in eager)
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))


@pytest.mark.parametrize("mode", MODES)
def test_graph_capture_replays_eager_results(mode):
    inputs, dout, dht = make_inputs([700, 300], 2, 4, seed=13)
    check_graph_replays_eager(cake.chunk_gated_delta_rule, inputs, dout, dht, mode)


def check_graph_replays_eager(op, inputs, dout, dht, mode):
    """op's forward and backward captured in a CUDA graph and replayed give the eager results."""
    x = {n: None if t is None else t.cuda().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    x["cu_seqlens"] = inputs["cu_seqlens"].cuda()
    dout, dht = dout.cuda(), dht.cuda()

    def step():
        for t in x.values():
            if t is not None:
                t.grad = None
        o, ht = op(
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
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)


GUARD = 4096  # bytes after each buffer that no call may touch


def guarded(nbytes):
    """A buffer of nbytes followed by GUARD bytes of 0xA5: (the whole, the first nbytes or None)."""
    whole = torch.full((nbytes + GUARD,), 0xA5, dtype=torch.uint8, device="cuda")
    return whole, whole[:nbytes] if nbytes else None


@pytest.mark.parametrize("mode", MODES)
def test_buffers_are_exact(mode):
    inputs, dout, dht = make_inputs([129, 64], 2, 4, seed=17)
    saved_bytes = check_buffers_exact(inputs, dout, dht, mode, ops.GDN)
    assert (saved_bytes > 0) == (MODES[mode] != 0)


def check_buffers_exact(inputs, dout, dht, mode, variant):
    """The forward and backward write no byte past the queried workspace and saved set, the
    backward never writes the saved set, and a buffer one byte short is refused with a message
    naming it. Returns the saved set's size."""
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    ins = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"], None,
           None)
    o = torch.empty(1, 193, 4, V, dtype=torch.bfloat16, device="cuda")
    ht = torch.empty(2, 4, K, V, device="cuda")
    opts = (variant, K ** -0.5, True, *OPTIONS.values(), MODES[mode], False)
    stream = torch.cuda.current_stream().cuda_stream
    saved_bytes = abi.forward_saved_size(*ins, o, ht, *opts)
    saved_whole, saved = guarded(saved_bytes)  # None where there is no saved set
    nbytes = abi.forward_workspace_size(*ins, o, ht, *opts)
    ws_whole, ws = guarded(nbytes)
    abi.forward(*ins, o, ht, *opts, saved, ws, stream)
    torch.cuda.synchronize()
    assert (ws_whole[nbytes:] == 0xA5).all(), "the forward wrote past its workspace"
    assert (saved_whole[saved_bytes:] == 0xA5).all(), "the forward wrote past its saved set"
    if nbytes:
        with pytest.raises(ValueError, match="workspace"):
            abi.forward(*ins, o, ht, *opts, saved, ws[: nbytes - 1], stream)
    if saved_bytes:
        with pytest.raises(ValueError, match="saved: expected at least"):
            abi.forward(*ins, o, ht, *opts, saved[: saved_bytes - 1], ws, stream)

    grads = [torch.empty_like(x[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")]
    bargs = (*ins, dout.cuda(), dht.cuda(), *grads, None, None)
    saved_before = saved_whole.clone()
    nbytes = abi.backward_workspace_size(*bargs, *opts)
    ws_whole, ws = guarded(nbytes)
    abi.backward(*bargs, *opts, saved, ws, stream)
    torch.cuda.synchronize()
    assert (ws_whole[nbytes:] == 0xA5).all(), "the backward wrote past its workspace"
    assert torch.equal(saved_whole, saved_before), "the backward wrote to the saved set"
    if nbytes:
        with pytest.raises(ValueError, match="workspace"):
            abi.backward(*bargs, *opts, saved, ws[: nbytes - 1], stream)
    if saved_bytes:
        with pytest.raises(ValueError, match="saved: expected at least"):
            abi.backward(*bargs, *opts, saved[: saved_bytes - 1], ws, stream)
    return saved_bytes


def test_saved_size_query_matches_the_forward():
    """The query (C ABI, real tensors), the shape-only query of the fake implementation and the
    blob cake::forward returns agree in every mode; a saved-mode forward's workspace holds none
    of the saved set."""
    inputs, _, _ = make_inputs([129, 64, 1], 2, 6, seed=19)
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    T, H = x["q"].shape[1], x["q"].shape[2]
    for l2 in (True, False):
        args = (ops.GDN, x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"],
                x["cu_seqlens"], None, None, K ** -0.5, True, l2, False, None, False, False)
        opts = (ops.GDN, K ** -0.5, l2, *OPTIONS.values())
        for mode in MODES.values():
            o, ht, blob = ops._forward(*args, mode, False)
            ins = (*args[1:10], o, ht)
            queried = abi.forward_saved_size(*ins, *opts, mode, False)
            assert blob.dtype == torch.uint8 and blob.numel() == queried
            assert (queried > 0) == (mode != 0)
            assert ops._saved_bytes_of_shapes(ops.GDN, x["q"], x["v"], x["cu_seqlens"], l2,
                                              mode) == queried
        # Saved- and inverse-mode forwards write their sets into the blob (q̂, k̂ and rstd of the
        # L2 norm too): their workspace is only the alignment slack; the recompute-mode
        # forward's holds q̂, k̂, rstd, G, A and beta.
        qk = 2 * T * H * K * 2 if l2 else 0  # q̂, k̂ in bf16, each a multiple of 256 bytes
        assert abi.forward_workspace_size(*ins, *opts, MODES["saved"], False) == 256
        assert abi.forward_workspace_size(*ins, *opts, MODES["inverse"], False) == 256
        assert abi.forward_workspace_size(*ins, *opts, MODES["recompute"], False) > 256 + qk


def test_saved_mode_through_autograd_and_compile():
    """The public function in every mode: identical o and gradients, eager and under
    torch.compile (the fake implementation gives the saved blob's size from shapes)."""
    inputs, dout, dht = make_inputs([300, 65], 2, 4, seed=29)
    unit_norm_qk(inputs)
    x = {n: None if t is None else t.cuda().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    names = ("q", "k", "v", "g", "beta", "initial_state")

    def step(fn, mode):
        for n in names:
            x[n].grad = None
        o, ht = fn(*(x[n] for n in names), x["cu_seqlens"], mode)
        torch.autograd.backward([o, ht], [dout.cuda(), dht.cuda()])
        return [o.detach(), ht.detach()] + [x[n].grad.clone() for n in names]

    def gdn(q, k, v, g, beta, h0, cu, mode):
        return cake.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                           output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           cu_seqlens=cu, save_for_backward=mode)

    want = step(gdn, "recompute")
    compiled = torch.compile(gdn, backend="aot_eager", fullgraph=True)
    for fn in (gdn, compiled):
        for mode in ("saved", "inverse"):
            for a, b in zip(want, step(fn, mode)):
                assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_autograd_keeps_no_qk_where_the_saved_set_has_them(mode):
    """With the L2 norm, saved and inverse modes keep q̂, k̂ and rstd in the saved set and the
    backward reads no element of q or k, so autograd must not hold them (FLA's activation
    memory); recompute mode needs them. Gradients as in recompute mode, bitwise."""
    inputs, dout, dht = make_inputs([300, 65], 2, 4, seed=31)
    x = {n: None if t is None else t.cuda().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        o, ht = cake.chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"],
            save_for_backward=mode)
    held = {t.untyped_storage().data_ptr() for t in kept}
    qk = {x[n].untyped_storage().data_ptr() for n in ("q", "k")}
    holds_qk = not held.isdisjoint(qk)
    assert holds_qk == (mode == "recompute"), f"{mode}: autograd holds q/k: {holds_qk}"
    torch.autograd.backward([o, ht], [dout.cuda(), dht.cuda()])
    got = [x[n].grad.clone() for n in ("q", "k", "v", "g", "beta", "initial_state")]
    want = run_gpu(inputs, dout, dht, True, mode="recompute")
    for name, a in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got):
        assert torch.equal(a, want[name].to(a.device)), f"{mode}: {name}"


def test_cuda_errors_are_clear():
    q = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
    g = torch.zeros(1, 8, 1, device="cuda")
    with pytest.raises(ValueError, match="K = V = 128"):
        cake.chunk_gated_delta_rule(q, q, v, g, g)
    q = torch.randn(1, 8, 1, K, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 1, V, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^g must have shape \[B, T, HV, K\]"):
        cake.chunk_kda(q, q, v, g, g)
    with pytest.raises(ValueError, match="q's device"):
        cake.chunk_gated_delta_rule(q, q, v, g.cpu(), g)
    with pytest.raises(ValueError, match=r"q must be bfloat16 .*got float16"):
        cake.chunk_gated_delta_rule(q.half(), q.half(), v.half(), g, g)
    with pytest.raises(ValueError, match=r"initial_state must be float32 .*got float64"):
        cake.chunk_gated_delta_rule(q, q, v, g, g,
                                    initial_state=torch.zeros(1, 1, K, V, device="cuda").double())
    with pytest.raises(ValueError, match=r"^A_log must have shape \[HV\] = \[1\], got \[2\]"):
        cake.chunk_gated_delta_rule(q, q, v, g, g, use_gate_in_kernel=True,
                                    A_log=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match=r"^dt_bias must have shape \[HV \* K\]"):
        cake.chunk_kda(q, q, v, torch.zeros(1, 8, 1, K, device="cuda"), g,
                       use_gate_in_kernel=True, A_log=torch.zeros(1, device="cuda"),
                       dt_bias=torch.zeros(3, device="cuda"))
    with pytest.raises(ValueError, match=r"^save_for_backward must be"):
        cake.chunk_gated_delta_rule(q, q, v, g, g, save_for_backward="everything")


def test_state_v_first_and_strided_inputs_on_cuda():
    """The V-first state layout and strided views (a slice of a fused projection) give the same
    results as dense K-first inputs, gradients included (the op copies them to dense rows)."""
    inputs, dout, dht = make_inputs([100, 29], 1, 2, seed=41)
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    qk = torch.stack([x["q"], x["k"]], dim=2)  # [1, T, 2, H, K]: q and k are strided views

    def run(q, k, h0, v_first):
        leaves = [t.detach().requires_grad_() for t in (q, k, h0)]
        o, ht = cake.chunk_gated_delta_rule(
            *leaves[:2], x["v"], x["g"], x["beta"], initial_state=leaves[2],
            output_final_state=True, state_v_first=v_first, cu_seqlens=x["cu_seqlens"],
            use_qk_l2norm_in_kernel=True)
        ht_k_first = ht.transpose(-1, -2) if v_first else ht
        torch.autograd.backward([o, ht_k_first], [dout.cuda(), dht.cuda()])
        dh0 = leaves[2].grad.transpose(-1, -2) if v_first else leaves[2].grad
        return [o, ht_k_first, leaves[0].grad, leaves[1].grad, dh0]

    want = run(x["q"], x["k"], x["initial_state"], False)
    got = run(qk[:, :, 0], qk[:, :, 1], x["initial_state"].transpose(-1, -2), True)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
