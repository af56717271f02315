"""KDA on the GPU against the FP64 reference (cake's own CPU path on the same inputs, upcast).

Accuracy gate (bench/workloads.json): for o, the final state and every gradient, relative RMS
error <= 1e-2 and max-abs error <= 2e-2 x max|ref|, all finite, into buffers poisoned with NaN
(through cake.abi directly), on the cases the KDA design asks for: bounded gates (down to -5 per
token and channel), unbounded ones (logsigmoid(N(0, 1)), some down to -20), g = 0 and -20 on
alternate channels of one token, beta near 0 and 1, documents of 1, 15, 16, 17, 63, 64, 65, many
short and one long, ~1,060 work items (several for each persistent CTA), GVA ratios 1, 3 and 4.
Also: the modes bitwise equal, determinism across runs and streams (on many items too), CUDA-graph
replay equal to eager, exact buffers. Skipped where there is no CUDA device.
"""

import functools
import zlib

import pytest
import torch
import torch.nn.functional as F

import cake
from cake import ops
import test_gpu_gdn
from test_gpu_gdn import check_gate

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
    return test_gpu_gdn.reference(inputs, dout, dht, True, variant=ops.KDA)


def run_gpu(inputs, dout, dht, stream=None, mode="recompute"):
    return test_gpu_gdn.run_gpu(inputs, dout, dht, True, stream=stream, mode=mode,
                                variant=ops.KDA)


MANY_ITEMS = [1 + 13 * i % 97 for i in range(300)]  # lengths 1 to 97, 14,700 tokens

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
    # ~1,060 (chunk slot, q/k head) items: on 132 SMs ~4 for each of kkt_solve's persistent CTAs
    # (two an SM) and ~8 for each of intra_bwd's (one an SM), which walk them in turn, crossing
    # documents, heads and chunks of every length
    "many_items": (MANY_ITEMS, 2, 4, {}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_accuracy(case, mode):
    inputs, dout, dht, want = case_with_reference(case)
    check_gate(run_gpu(inputs, dout, dht, mode=mode), want, f"kda {case} {mode}")


@functools.lru_cache(maxsize=1)
def case_with_reference(case):
    """A case's inputs and their FP64 reference, computed once for the modes that run it in turn."""
    docs, H, HV, kw = CASES[case]
    inputs, dout, dht = make_inputs(docs, H, HV, seed=zlib.crc32(case.encode()), **kw)
    return inputs, dout, dht, reference(inputs, dout, dht)


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


@pytest.mark.parametrize("docs", [[1000, 2000, 77], MANY_ITEMS], ids=["three_docs", "many_items"])
@pytest.mark.parametrize("mode", MODES)
def test_deterministic_across_runs_and_streams(mode, docs):
    inputs, dout, dht = make_inputs(docs, 2, 6, seed=11, gate_kind="unbounded")
    results = [run_gpu(inputs, dout, dht, stream=torch.cuda.Stream(), mode=mode)
               for _ in range(3)]
    for other in results[1:]:
        for name, t in results[0].items():
            assert torch.equal(t, other[name]), f"{name} differs between runs"


@pytest.mark.parametrize("mode", MODES)
def test_graph_capture_replays_eager_results(mode):
    inputs, dout, dht = make_inputs([700, 300], 2, 4, seed=13)
    test_gpu_gdn.check_graph_replays_eager(cake.chunk_kda, inputs, dout, dht, mode)


@pytest.mark.parametrize("mode", MODES)
def test_buffers_are_exact(mode):
    """As GDN's (test_gpu_gdn.check_buffers_exact); KDA's recompute mode keeps no saved set,
    inverse mode keeps A, P, beta and G's last rows, saved mode the whole chunk pass
    (docs/design/kda-hopper.md)."""
    inputs, dout, dht = make_inputs([129, 64], 2, 4, seed=17)
    saved_bytes = test_gpu_gdn.check_buffers_exact(inputs, dout, dht, mode, ops.KDA)
    assert (saved_bytes > 0) == (mode != "recompute")


@pytest.mark.parametrize("variant, lower_bound", [("gdn", None), ("kda", None), ("kda", -3.0)],
                         ids=["gdn-softplus", "kda-softplus", "kda-lower_bound"])
@pytest.mark.parametrize("raw_dtype, docs, H, HV", [
    (torch.float32, [65, 300, 1], 2, 4), (torch.bfloat16, [65, 300, 1], 2, 4),
    (torch.float16, [65, 300, 1], 2, 4), (torch.bfloat16, [9000, 2], 1, 3)],
    ids=["fp32", "bf16", "fp16", "bf16-long"])
def test_in_op_gate_and_beta_sigmoid_on_cuda(variant, lower_bound, raw_dtype, docs, H, HV):
    """use_gate_in_kernel (A_log, dt_bias; KDA also with lower_bound) and
    use_beta_sigmoid_in_kernel with allow_neg_eigval on CUDA (the op's gate kernels,
    src/kernels/gate, with the raw g and beta in raw_dtype as a layer's projections give them)
    against the same call on the CPU reference (FP64): o, the final state and every gradient,
    dA_log and ddt_bias included, within the gate; and two CUDA runs bitwise equal. The long
    document has more 256-token tiles than one round of the sums' reduction takes (32), with an
    odd HV (the FP64 reference takes ~10 s of it on two cores)."""
    check_in_op_gate(variant, lower_bound, raw_dtype, docs, H, HV)


def test_in_op_sigmoid_slopes_where_the_sigmoid_rounds_to_one_on_cuda():
    """The lower-bound gate's and beta's sigmoid with every raw value in [18, 24] (A_log and
    dt_bias zero): the sigmoid rounds to 1 in float32 there, its slope ~e^-x does not, and every
    element of dg_raw and dbeta_raw comes from that slope (a slope taken as s (1 - s) gives 0)."""
    check_in_op_gate("kda", -3.0, torch.float32, [65, 300, 1], 2, 4, sigmoid_near_one=True)


def check_in_op_gate(variant, lower_bound, raw_dtype, docs, H, HV, sigmoid_near_one=False):
    kda = variant == "kda"  # lower_bound is KDA's alone
    gen = torch.Generator().manual_seed(31)
    T, N = sum(docs), len(docs)
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T, H, K, generator=gen),
             v=torch.randn(1, T, HV, V, generator=gen),
             g=torch.randn((1, T, HV, K) if kda else (1, T, HV), generator=gen),
             beta=torch.randn(1, T, HV, generator=gen),
             initial_state=torch.randn(N, HV, K, V, generator=gen),
             A_log=torch.rand(HV, generator=gen), dt_bias=torch.randn(HV * K if kda else HV,
                                                                      generator=gen))
    if sigmoid_near_one:
        for n in ("g", "beta"):
            x[n] = 18 + 6 * torch.rand(x[n].shape, generator=gen)
        x["A_log"], x["dt_bias"] = x["A_log"].zero_(), x["dt_bias"].zero_()
    for n in ("g", "beta"):  # values the raw dtype holds exactly, so both runs read the same
        x[n] = x[n].to(raw_dtype).float()
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    extra = dict(lower_bound=lower_bound) if kda else {}

    def run(device, dtype):
        leaves = {n: (t.to(dtype) if n in ("q", "k", "v") else t.double() if dtype == torch.float64
                      else t.to(raw_dtype) if n in ("g", "beta") else t).to(device).requires_grad_()
                  for n, t in x.items()}
        o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                   initial_state=leaves["initial_state"], output_final_state=True,
                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                   use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                   A_log=leaves["A_log"], dt_bias=leaves["dt_bias"], cu_seqlens=cu.to(device),
                   **extra)
        torch.autograd.backward([o, ht], [do.to(device, o.dtype), dht.to(device, ht.dtype)])
        return {"o": o.detach().cpu(), "final_state": ht.detach().cpu(),
                **{"d" + n: t.grad.cpu() for n, t in leaves.items()}}

    cuda = run("cuda", torch.bfloat16)
    check_gate(cuda, run("cpu", torch.float64), f"{variant} in-op gate, raw {raw_dtype}")
    again = run("cuda", torch.bfloat16)
    assert all(torch.equal(cuda[n], again[n]) for n in cuda), "two CUDA runs differ"

