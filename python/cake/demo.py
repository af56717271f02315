"""The main job: one training step of a GDN layer and a KDA layer on a synthetic packed batch.

    python -m cake.demo            # GPU when there is one (and the layer has GPU kernels), else CPU

Each layer projects x to q, k, v, a gate and beta, runs cake's op over packed documents, projects
back, and takes an AdamW step on a regression loss. Printed: device, loss before and after the
step, and tokens per second of the forward + backward.
"""

import argparse
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for kind in ("gdn", "kda"):
        use_gpu = not args.cpu and has_gpu_kernels(kind)
        if not args.cpu and torch.cuda.is_available() and not use_gpu:
            print(f"{kind.upper()} has no GPU kernels yet: running it on the CPU reference")
        train_step(kind, torch.device("cuda" if use_gpu else "cpu"), args.seed)


if __name__ == "__main__":
    main()
