"""The main job: one training step of a GDN layer and a KDA layer on a synthetic packed batch.

    python -m cake.demo            # GPU when there is one (and the layer has GPU kernels), else CPU
    python -m cake.demo --help     # the options and what the printed lines mean

Each layer projects x to q, k, v, a gate and beta, runs cake's op over packed documents, projects
back, and takes an AdamW step on a regression loss. Printed: device, loss before and after the
step, and tokens per second of the forward + backward.
"""

import argparse
import time
import warnings

import torch
from torch import nn
import torch.nn.functional as F

import cake


class DeltaLayer(nn.Module):
    """A minimal gated-delta layer: kind "gdn" (scalar decay per head) or "kda" (per channel)."""

    def __init__(self, kind: str, dim: int, num_qk_heads: int, num_v_heads: int, head_dim: int):
        super().__init__()
        self.kind, self.H, self.HV, self.K = kind, num_qk_heads, num_v_heads, head_dim
        gate_width = num_v_heads * (head_dim if kind == "kda" else 1)
        self.q_proj = nn.Linear(dim, num_qk_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, num_qk_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, num_v_heads * head_dim, bias=False)
        self.a_proj = nn.Linear(dim, gate_width, bias=False)
        self.b_proj = nn.Linear(dim, num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1, 16, num_v_heads)))
        self.dt_bias = nn.Parameter(torch.zeros(gate_width))
        self.o_proj = nn.Linear(num_v_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.K)
        k = self.k_proj(x).view(B, T, self.H, self.K)
        v = self.v_proj(x).view(B, T, self.HV, self.K)
        a = self.a_proj(x).view(B, T, self.HV, -1).float()
        # The gate in torch, so that the same layer runs on every device: g = -exp(A_log) softplus.
        g = -self.A_log.exp().view(1, 1, -1, 1) * F.softplus(a + self.dt_bias.view(self.HV, -1))
        beta = self.b_proj(x).float().sigmoid()
        if self.kind == "gdn":
            o, _ = cake.chunk_gated_delta_rule(q, k, v, g.squeeze(-1), beta, cu_seqlens=cu_seqlens,
                                               use_qk_l2norm_in_kernel=True)
        else:
            o, _ = cake.chunk_kda(q, k, v, g, beta, cu_seqlens=cu_seqlens,
                                  use_qk_l2norm_in_kernel=True)
        return self.o_proj(o.reshape(B, T, -1))


def has_gpu_kernels(kind: str) -> bool:
    return kind == "gdn" and torch.cuda.is_available()


def train_step(kind: str, device: torch.device, seed: int) -> None:
    on_gpu = device.type == "cuda"
    torch.manual_seed(seed)
    # Sizes: a real layer on the GPU (head dim 128), a small one on the CPU's FP64 reference.
    dim, H, HV, K = (1024, 4, 8, 128) if on_gpu else (256, 2, 4, 32)
    docs = [4096, 8192, 2048, 1947] if on_gpu else [700, 1024, 300, 64, 1]
    dtype = torch.bfloat16 if on_gpu else torch.float32
    if not on_gpu:
        # Small float32 heads on purpose, for the reference's speed: no warning that CUDA would
        # refuse them.
        warnings.simplefilter("ignore", cake.CudaSupportWarning)
    T = sum(docs)
    cu_seqlens = torch.tensor([0] + docs, device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    layer = DeltaLayer(kind, dim, H, HV, K).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x = torch.randn(1, T, dim, device=device, dtype=dtype)
    target = torch.randn(1, T, dim, device=device, dtype=dtype)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(layer(x, cu_seqlens).float(), target.float())
        loss.backward()
        optimizer.step()
        return loss.item()

    start = time.perf_counter()
    loss_before = step()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        loss_after = F.mse_loss(layer(x, cu_seqlens).float(), target.float()).item()
    grads_finite = all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    print(f"{kind.upper():3s} on {device.type}: {len(docs)} documents, {T} tokens, H={H} HV={HV} "
          f"K=V={K}, {str(dtype).removeprefix('torch.')}: loss {loss_before:.5f} -> {loss_after:.5f}, "
          f"gradients finite: {grads_finite}, {T / seconds:,.0f} tokens/s (forward + backward + step)")
    if not grads_finite or not loss_after < loss_before:
        raise SystemExit(f"{kind}: the training step did not reduce the loss with finite gradients")


DESCRIPTION = """\
One training step of a Gated DeltaNet (GDN) layer and of a Kimi Delta Attention (KDA) layer,
each on random tensors: the layer projects x to q, k, v, a gate g and beta, runs cake's op
(cake.chunk_gated_delta_rule, cake.chunk_kda) over several documents packed into one sequence
(cu_seqlens), projects back, and takes one AdamW step (lr 1e-3) on the mean squared error to a
random target.

On a machine with a CUDA GPU, GDN runs cake's sm_90a kernels (bfloat16, dim 1024, 4 q/k heads,
8 value heads, head dim 128, documents of 4096, 8192, 2048 and 1947 tokens); KDA has no GPU
kernels yet and runs on the CPU. On the CPU, both run cake's FP64 C++ reference on a smaller
layer (float32 tensors, dim 256, 2 q/k heads, 4 value heads, head dim 32, documents of 700, 1024,
300, 64 and 1 tokens). The GPU path needs cake built with its CUDA kernels (CAKE_CUDA=AUTO finds
nvcc, or ON); with a CPU-only build on a GPU machine, use --cpu."""

EPILOG = """\
output: one line per layer, e.g.
  GDN on cuda: 4 documents, 16283 tokens, H=4 HV=8 K=V=128, bfloat16: loss 1.00021 -> 0.99874,
  gradients finite: True, 1,234,567 tokens/s (forward + backward + step)
where
  GDN / KDA          the layer: GDN decays the state by a scalar per token and value head,
                     KDA by one per key channel
  on cuda / on cpu   where it ran: cuda = cake's GPU kernels, cpu = the FP64 reference
  N documents,       the packed batch: N documents (B = 1) of T tokens in all
  T tokens
  H, HV, K=V         q/k heads, value heads (each group of HV/H value heads shares a q/k head),
                     key and value head dims
  bfloat16/float32   the dtype of the layer's weights and tensors (the CPU reference computes
                     in FP64 inside)
  loss A -> B        the loss before the AdamW step and after it, on the same batch: B < A
                     shows the gradients point downhill (both near 1: random target)
  gradients finite   every parameter got a gradient with no NaN or inf
  tokens/s           T divided by the wall time of the one step (forward + backward + AdamW),
                     first call included: a sanity figure, not a benchmark (bench/ has those)
A line "KDA has no GPU kernels yet: running it on the CPU reference" precedes KDA's on a GPU
machine. The exit status is 0 when both layers reduced the loss with finite gradients, else
non-zero with a message naming the layer.

examples:
  python -m cake.demo                 GPU where present, else CPU
  python -m cake.demo --cpu           the CPU reference even on a GPU machine
  python -m cake.demo --seed 3        other random weights and tensors
  bash tools/demo.sh --cpu            the same after tools/setup.sh (arguments pass through)"""


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cake.demo", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true",
                        help="run both layers on the CPU (cake's FP64 reference, the smaller "
                             "layer) even where a GPU is present")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of torch's generator, which draws the layer's weights, x and "
                             "the target (default: %(default)s)")
    args = parser.parse_args()
    for kind in ("gdn", "kda"):
        use_gpu = not args.cpu and has_gpu_kernels(kind)
        if not args.cpu and torch.cuda.is_available() and not use_gpu:
            print(f"{kind.upper()} has no GPU kernels yet: running it on the CPU reference")
        train_step(kind, torch.device("cuda" if use_gpu else "cpu"), args.seed)


if __name__ == "__main__":
    main()
