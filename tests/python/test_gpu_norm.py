"""rms_norm_gated on the GPU against the FP64 reference (cake's own CPU path on the same inputs,
upcast).

Accuracy gate (bench/workloads.json): for y and every gradient, relative RMS error <= 1e-2 and
max-abs error <= 2e-2 x max|ref|, all finite (1e-5 both for float32 rows). Outputs and gradients
are written into buffers poisoned with NaN, through cake.abi directly, so that an element the
kernels never write fails. Also: determinism of dweight (bitwise), CUDA-graph replay equal to
eager, the exact workspace (guard bytes after it untouched), no rows, inputs without a gate or a
weight, gates where the sigmoid's exp overflows, a misaligned view, the autograd op and the
layer. Skipped where there is no CUDA device.
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

SILU, SIGMOID = 1, 2
GUARD = 4096


def make_inputs(shape, *, seed, dtype=torch.bfloat16, weight_dtype=torch.float32, scale=1.0,
                gated=True, weighted=True):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s, dt: torch.randn(*s, generator=gen).to(dt).cuda()  # noqa: E731
    x = randn(*shape, dt=torch.float32) * scale
    if x.numel():
        x[0] = 0  # an all-zero row: rstd = 1 / sqrt(eps)
    return dict(x=x.to(dtype), g=randn(*shape, dt=dtype) if gated else None,
                weight=randn(shape[-1], dt=weight_dtype) if weighted else None), \
        randn(*shape, dt=dtype)


def poisoned_like(t):
    return None if t is None else torch.full_like(t, float("nan"))


def run(inputs, dy, activation=SILU, eps=1e-5):
    """y, dx, dg, dweight through the C ABI into poisoned buffers (None for an absent g or
    weight); the backward's workspace is the exact query with guard bytes after it."""
    x, g, w = inputs["x"], inputs["g"], inputs["weight"]
    y = poisoned_like(x)
    rstd = torch.full((x.numel() // x.shape[-1],), float("nan"), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    abi.norm_forward(x, g, w, y, rstd, eps, activation, stream)
    dx, dg, dw = poisoned_like(x), poisoned_like(g), poisoned_like(w)
    bwd = (x, g, w, rstd, dy, dx, dg, dw, activation)
    nbytes = abi.norm_backward_workspace_size(*bwd)
    workspace = torch.full((nbytes + GUARD,), 0xA5, dtype=torch.uint8, device="cuda")
    abi.norm_backward(*bwd, workspace, stream)
    torch.cuda.synchronize()
    assert bool((workspace[nbytes:] == 0xA5).all()), "the backward wrote past its workspace"
    got = dict(y=y, dx=dx, dg=dg, dweight=dw)
    return {name: t for name, t in got.items() if t is not None}


def reference(inputs, dy, activation="swish", eps=1e-5):
    """The same quantities from the FP64 CPU reference on the upcast inputs."""
    names = [k for k in ("x", "g", "weight") if inputs[k] is not None]
    up = {k: inputs[k].cpu().double().requires_grad_() for k in names}
    y = cake.rms_norm_gated(up["x"], up.get("g"), up.get("weight"), eps, activation)
    grads = torch.autograd.grad((y * dy.cpu().double()).sum(), [up[k] for k in names])
    return dict(y=y.detach(), **{{"x": "dx", "g": "dg", "weight": "dweight"}[k]: d
                                 for k, d in zip(names, grads)})


def check_gate(got, ref, dtype=torch.bfloat16):
    """The accuracy gate for 16-bit rows; float32 rows, computed in float32 throughout, to 1e-5
    (a kernel that rounded through a 16-bit type would fail it), except an output returned in a
    16-bit type (dweight in a bfloat16 weight's dtype), which the rounding at its end alone puts
    at ~1e-3: the 16-bit gate there."""
    assert set(got) == set(ref)
    for name, r in ref.items():  # a non-finite element: one the kernels never wrote?
        tight = dtype == torch.float32 and got[name].dtype == torch.float32
        rms_bound, max_bound = (1e-5, 1e-5) if tight else (1e-2, 2e-2)
        assert_within_gate(got[name].cpu(), r, name, rel_rms=rms_bound, max_abs=max_bound)


# N = 24, 96, 200, 1000: vector counts a row that are no power of two, so that lanes hold
# vectors past the row's end, which they must neither read nor write.
@pytest.mark.parametrize("activation", [SILU, SIGMOID])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("N", [64, 128, 256, 1024, 24, 96, 200, 1000])
def test_accuracy_gate(activation, dtype, N):
    # 4099 rows: not a multiple of any block's rows
    inputs, dy = make_inputs((4099, N), seed=N + activation, dtype=dtype)
    check_gate(run(inputs, dy, activation),
               reference(inputs, dy, "silu" if activation == SILU else "sigmoid"), dtype)


@pytest.mark.parametrize("gated, weighted", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_without_gate_or_weight(gated, weighted, dtype):
    inputs, dy = make_inputs((777, 3, 128), seed=5, dtype=dtype, gated=gated, weighted=weighted)
    check_gate(run(inputs, dy), reference(inputs, dy), dtype)


@pytest.mark.parametrize("dtype, weight_dtype", [(torch.bfloat16, torch.bfloat16),
                                                 (torch.float32, torch.bfloat16),
                                                 (torch.float16, torch.float32)])
def test_large_values_and_weight_dtypes(dtype, weight_dtype):
    inputs, dy = make_inputs((3, 1000, 8, 128), seed=3, dtype=dtype, weight_dtype=weight_dtype,
                             scale=1e3)
    check_gate(run(inputs, dy), reference(inputs, dy), dtype)


# Gates where the sigmoid's exp overflows or its divisor passes 2^126 (the approximate division
# returns 0 there): -88.5 .. -87.5 lie in that band, +-1e4 far past it; all exact in bfloat16.
EXTREME_GATES = [-1e4, -200, -90, -88.5, -88, -87.5, -86, -20, 20, 87.5, 88.5, 90, 200, 1e4]


@pytest.mark.parametrize("activation", [SILU, SIGMOID])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_extreme_gates(activation, dtype):
    inputs, dy = make_inputs((4099, 128), seed=6, dtype=dtype)
    pattern = torch.tensor(EXTREME_GATES, dtype=dtype, device="cuda")
    inputs["g"] = pattern.repeat(4099 * 128 // len(pattern) + 1)[:4099 * 128].view(4099, 128)
    check_gate(run(inputs, dy, activation),
               reference(inputs, dy, "silu" if activation == SILU else "sigmoid"), dtype)


def test_no_rows_give_zero_dweight():
    inputs, dy = make_inputs((0, 128), seed=4)
    got = run(inputs, dy)
    assert got["y"].shape == (0, 128)
    assert torch.equal(got["dweight"], torch.zeros(128, device="cuda"))


def test_misaligned_view_is_copied_not_refused():
    """A contiguous view at an odd offset of its buffer (not 16-byte aligned) runs, as any
    strided input does."""
    inputs, dy = make_inputs((64, 128), seed=6)
    buffer = torch.empty(64 * 128 + 1, dtype=torch.bfloat16, device="cuda")
    x = buffer[1:].view(64, 128)
    x.copy_(inputs["x"])
    assert x.data_ptr() % 16
    y = cake.rms_norm_gated(x, inputs["g"], inputs["weight"])
    assert torch.equal(y, cake.rms_norm_gated(inputs["x"], inputs["g"], inputs["weight"]))


def test_compiled_backward_of_misaligned_views():
    """torch.compile (aot_eager: the backward rule traced on fake tensors) of the norm on x and
    dy at odd offsets of their buffers (not 16-byte aligned): the same y and gradients as the
    eager call on aligned copies."""
    inputs, dy = make_inputs((64, 128), seed=8)

    def misaligned(t, requires_grad=False):
        """t's values as a view one element into a buffer: (the view, the buffer)."""
        buffer = torch.zeros(t.numel() + 1, dtype=t.dtype, device="cuda")
        buffer[1:].copy_(t.flatten())
        buffer.requires_grad_(requires_grad)
        return buffer[1:].view(t.shape), buffer

    def grads(fn, x_view, x_leaf, dy):
        g, w = inputs["g"].clone().requires_grad_(), inputs["weight"].clone().requires_grad_()
        y = fn(x_view, g, w)
        y.backward(dy)
        return y.detach(), x_leaf.grad, g.grad, w.grad

    x, x_buffer = misaligned(inputs["x"], requires_grad=True)
    dy_view, _ = misaligned(dy)
    assert x.data_ptr() % 16 and dy_view.data_ptr() % 16
    compiled = torch.compile(cake.rms_norm_gated, backend="aot_eager", fullgraph=True)
    y, dx_buffer, dg, dw = grads(compiled, x, x_buffer, dy_view)
    x_eager = inputs["x"].clone().requires_grad_()
    want = grads(cake.rms_norm_gated, x_eager, x_eager, dy)
    assert torch.equal(y, want[0])
    assert torch.equal(dx_buffer[1:].view(x.shape), want[1])
    assert torch.equal(dg, want[2]) and torch.equal(dw, want[3])


def test_deterministic_bitwise():
    inputs, dy = make_inputs((32768, 8, 128), seed=7)
    a, b = run(inputs, dy), run(inputs, dy)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_cuda_graph_replay_equals_eager():
    inputs, dy = make_inputs((3000, 4, 128), seed=9)
    eager = run(inputs, dy)
    x, g, w = (inputs[k].clone().requires_grad_() for k in ("x", "g", "weight"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture
            cake.rms_norm_gated(x, g, w).backward(dy)
    torch.cuda.current_stream().wait_stream(stream)
    x.grad = g.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = cake.rms_norm_gated(x, g, w)
        y.backward(dy)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager["y"])
    assert torch.equal(x.grad, eager["dx"])
    assert torch.equal(g.grad, eager["dg"])
    assert torch.equal(w.grad, eager["dweight"])


def test_layers_on_cuda_match_the_reference():
    inputs, dy = make_inputs((2, 500, 4, 128), seed=11)
    layer = cake.layers.FusedRMSNormGated(128, activation="sigmoid").cuda()
    with torch.no_grad():
        layer.weight.copy_(inputs["weight"])
    y = layer(inputs["x"], inputs["g"].float())  # g cast to x's dtype, as under autocast
    assert y.dtype == torch.bfloat16
    check_gate({"y": y}, {"y": reference(inputs, dy, "sigmoid")["y"]})
