"""rms_norm_gated on the GPU against the FP64 reference (cake's own CPU path on the same inputs,
upcast).

Accuracy gate (bench/workloads.json): for y and every gradient, relative RMS error <= 1e-2 and
max-abs error <= 2e-2 x max|ref|, all finite. Outputs and gradients are written into buffers
poisoned with NaN, through cake.abi directly, so that an element the kernels never write fails.
Also: determinism of dweight (bitwise), CUDA-graph replay equal to eager, the exact workspace
(guard bytes after it untouched), the autograd op. Skipped where there is no CUDA device.
"""

import pytest
import torch

import cake
from cake import abi

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SILU, SIGMOID = 1, 2
GUARD = 4096


def make_inputs(shape, *, seed, dtype=torch.bfloat16, weight_dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s, dt: torch.randn(*s, generator=gen).to(dt).cuda()  # noqa: E731
    x = randn(*shape, dt=torch.float32) * scale
    x[0] = 0  # an all-zero row: rstd = 1 / sqrt(eps)
    return dict(x=x.to(dtype), g=randn(*shape, dt=dtype),
                weight=randn(shape[-1], dt=weight_dtype)), randn(*shape, dt=dtype)


def poisoned_like(t):
    return torch.full_like(t, float("nan"))


def run(inputs, dy, activation=SILU, eps=1e-5):
    """y, dx, dg, dweight through the C ABI into poisoned buffers; the backward's workspace is
    the exact query with guard bytes after it."""
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
    return dict(y=y, dx=dx, dg=dg, dweight=dw)


def reference(inputs, dy, activation="swish", eps=1e-5):
    """The same quantities from the FP64 CPU reference on the upcast inputs."""
    x, g, w = (inputs[k].cpu().double().requires_grad_() for k in ("x", "g", "weight"))
    y = cake.rms_norm_gated(x, g, w, eps, activation)
    grads = torch.autograd.grad((y * dy.cpu().double()).sum(), (x, g, w))
    return dict(y=y.detach(), **dict(zip(("dx", "dg", "dweight"), grads)))


def check_gate(got, ref):
    for name, r in ref.items():
        g = got[name].cpu().double()
        assert torch.isfinite(g).all(), f"{name}: not finite (an unwritten element?)"
        err = g - r
        rel_rms = (err.square().mean().sqrt() / r.square().mean().sqrt().clamp_min(1e-30)).item()
        max_rel = (err.abs().max() / r.abs().max().clamp_min(1e-30)).item()
        assert rel_rms <= 1e-2 and max_rel <= 2e-2, f"{name}: rel-RMS {rel_rms}, max {max_rel}"


@pytest.mark.parametrize("activation", [SILU, SIGMOID])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N", [64, 128, 256, 1024])
def test_accuracy_gate(activation, dtype, N):
    # 4099 rows: not a multiple of any block's rows
    inputs, dy = make_inputs((4099, N), seed=N + activation, dtype=dtype)
    check_gate(run(inputs, dy, activation),
               reference(inputs, dy, "silu" if activation == SILU else "sigmoid"))


def test_large_values_and_weight_in_x_dtype():
    inputs, dy = make_inputs((3, 1000, 8, 128), seed=3, weight_dtype=torch.bfloat16, scale=1e3)
    check_gate(run(inputs, dy), reference(inputs, dy))


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
