"""causal_conv1d on the GPU against the FP64 reference (cake's own CPU path on the same inputs,
upcast).

Accuracy gate (bench/workloads.json): for y, final_state and every gradient, relative RMS error
<= 1e-2 and max-abs error <= 2e-2 x max|ref|, all finite. Outputs and gradients are written into
buffers poisoned with NaN, through cake.abi directly, so that an element the kernels never write
fails. Also: pre-activations where SiLU's exp overflows, determinism (bitwise), CUDA-graph replay
equal to eager, the exact workspace (guard bytes after it untouched), the autograd op. Skipped where there is no CUDA device.
"""

import pytest
import torch

import cake
from cake import abi
from test_layers import assert_within_gate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SILU = 1
GUARD = 4096


def make_inputs(docs, D, W, *, seed, dtype=torch.bfloat16, small_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(docs), len(docs)
    randn = lambda *s, dt: torch.randn(*s, generator=gen).to(dt).cuda()  # noqa: E731
    inputs = dict(x=randn(1, T, D, dt=dtype), weight=randn(D, W, dt=small_dtype),
                  bias=randn(D, dt=small_dtype), residual=randn(1, T, D, dt=dtype),
                  initial_state=randn(N, D, W, dt=dtype),
                  cu_seqlens=torch.tensor([0, *docs]).cumsum(0).to(torch.int32).cuda())
    return inputs, randn(1, T, D, dt=dtype), randn(N, D, W, dt=dtype)


def poisoned_like(t):
    return torch.full_like(t, float("nan"))


def run(inputs, dy, dht, activation=SILU):
    """y, final_state, dx, dweight, dbias, dinitial_state through the C ABI into poisoned buffers;
    the backward's workspace is the exact query with guard bytes after it."""
    i = inputs
    y, ht = poisoned_like(i["x"]), poisoned_like(i["initial_state"])
    fwd = (i["x"], i["weight"], i["bias"], i["residual"], i["initial_state"], i["cu_seqlens"], y,
           ht, activation)
    assert abi.conv1d_forward_workspace_size(*fwd) == 0
    abi.conv1d_forward(*fwd, None, torch.cuda.current_stream().cuda_stream)
    dx, dw = poisoned_like(i["x"]), poisoned_like(i["weight"])
    db, dh0 = poisoned_like(i["bias"]), poisoned_like(i["initial_state"])
    bwd = (i["x"], i["weight"], i["bias"], i["initial_state"], i["cu_seqlens"], dy, dht, dx, dw,
           db, dh0, activation)
    nbytes = abi.conv1d_backward_workspace_size(*bwd)
    workspace = torch.full((nbytes + GUARD,), 0xA5, dtype=torch.uint8, device="cuda")
    abi.conv1d_backward(*bwd, workspace, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert bool((workspace[nbytes:] == 0xA5).all()), "the backward wrote past its workspace"
    return dict(y=y, final_state=ht, dx=dx, dweight=dw, dbias=db, dinitial_state=dh0)


def reference(inputs, dy, dht):
    """The same quantities from the FP64 CPU reference on the upcast inputs."""
    x = {k: v.cpu().double().requires_grad_() if v.is_floating_point() else v.cpu()
         for k, v in inputs.items()}
    y, ht = cake.causal_conv1d(x["x"], x["weight"], x["bias"], x["residual"],
                               x["initial_state"], True, "silu", None,
                               x["cu_seqlens"])
    grads = torch.autograd.grad((y * dy.cpu().double()).sum() + (ht * dht.cpu().double()).sum(),
                                (x["x"], x["weight"], x["bias"], x["initial_state"]))
    return dict(y=y.detach(), final_state=ht.detach(), **dict(zip(
        ("dx", "dweight", "dbias", "dinitial_state"), grads)))


def check_gate(got, ref):
    for name, r in ref.items():  # a non-finite element: one the kernels never wrote?
        assert_within_gate(got[name].cpu(), r, name)


ADVERSARIAL = [1, 2, 3, 4, 5]


# Every width at a tiled (2048) and a ragged (100) channel count; the widest layer's 6144 channels
# at the layers' W = 4 only, since the width does not change how channels are tiled (each of those
# cases costs seconds of FP64 reference).
SHAPES = [(D, W) for D in (2048, 100) for W in (2, 3, 4)] + [(6144, 4)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D, W", SHAPES)
def test_accuracy_gate(W, dtype, D):
    docs = [*ADVERSARIAL, W - 1, W, W + 1, 0, 700, 3000]
    inputs, dy, dht = make_inputs(docs, D, W, seed=W * 31 + D, dtype=dtype)
    check_gate(run(inputs, dy, dht), reference(inputs, dy, dht))


@pytest.mark.parametrize("small_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_and_states(small_dtype):
    inputs, dy, dht = make_inputs([3, 1, 400], 256, 4, seed=5, small_dtype=small_dtype)
    check_gate(run(inputs, dy, dht), reference(inputs, dy, dht))


@pytest.mark.parametrize("sign", [-1, 1])
def test_extreme_pre_activations(sign):
    """Biases of +-80 .. 95 sweep SiLU's input across the band where the sigmoid's exp overflows
    or its divisor passes 2^126 (the approximate division returns 0 there)."""
    inputs, dy, dht = make_inputs([3, 1, 400], 2048, 4, seed=7)
    inputs["bias"] = sign * torch.linspace(80, 95, 2048, device="cuda")
    check_gate(run(inputs, dy, dht), reference(inputs, dy, dht))


def test_deterministic_bitwise():
    inputs, dy, dht = make_inputs([5000, 3, 20000], 2048, 4, seed=7)
    a, b = run(inputs, dy, dht), run(inputs, dy, dht)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_cuda_graph_replay_equals_eager():
    inputs, dy, dht = make_inputs([1000, 2, 3000], 2048, 4, seed=9)
    eager = run(inputs, dy, dht)
    x = inputs["x"].clone().requires_grad_()
    w = inputs["weight"].clone().requires_grad_()
    static = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture
            y, ht = cake.causal_conv1d(x, w, inputs["bias"], inputs["residual"],
                                       inputs["initial_state"], True, "silu", None,
                                       inputs["cu_seqlens"])
            torch.autograd.backward([y, ht], [dy, dht])
    torch.cuda.current_stream().wait_stream(stream)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static["y"], static["ht"] = cake.causal_conv1d(
            x, w, inputs["bias"], inputs["residual"], inputs["initial_state"], True, "silu",
            None, inputs["cu_seqlens"])
        torch.autograd.backward([static["y"], static["ht"]], [dy, dht])  # as run() does
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static["y"], eager["y"])
    assert torch.equal(static["ht"], eager["final_state"])
    assert torch.equal(x.grad, eager["dx"])
    assert torch.equal(w.grad, eager["dweight"])


def test_autograd_op_matches_abi():
    inputs, dy, dht = make_inputs([17, 4, 300], 512, 3, seed=11)
    eager = run(inputs, dy, dht)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    y, ht = cake.causal_conv1d(**leaves, output_final_state=True, activation="swish",
                               cu_seqlens=inputs["cu_seqlens"])
    torch.autograd.backward((y, ht), (dy, dht))
    assert torch.equal(y, eager["y"]) and torch.equal(ht, eager["final_state"])
    assert torch.equal(leaves["x"].grad, eager["dx"])
    assert torch.equal(leaves["residual"].grad, dy)
    assert torch.equal(leaves["initial_state"].grad, eager["dinitial_state"])


def test_batch_rows_without_cu_seqlens():
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(3, 77, 64, generator=gen).bfloat16().cuda()
    w = torch.randn(64, 4, generator=gen).cuda()
    y, ht = cake.causal_conv1d(x, w, activation="silu", output_final_state=True)
    y_ref, ht_ref = cake.causal_conv1d(x.cpu().double(), w.cpu().double(), activation="silu",
                                       output_final_state=True)
    check_gate({"y": y, "final_state": ht}, {"y": y_ref, "final_state": ht_ref})
