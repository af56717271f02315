"""The language model: byte embedding, blocks of (RMSNorm, a linear-attention layer, residual,
RMSNorm, SwiGLU MLP, residual), a final RMSNorm and the byte head.

Every block's layer is a GatedDeltaNet ("gdn") or KimiDeltaAttention ("kda") from cake.layers, or
the same class from flash-linear-attention (``impl="fla"``); the two have the same parameter
names, so one model's state dict loads into the other and both start from the same weights.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from .corpus import VOCAB_SIZE

LAYER_KINDS = ("gdn", "kda")


@dataclass(frozen=True)
class ModelConfig:
    layers: tuple[str, ...]   # one entry per block: "gdn" or "kda"
    d_model: int              # hidden size
    num_heads: int            # q/k heads of each layer
    num_v_heads: int          # value heads (a multiple of num_heads)
    head_dim: int             # K = V (expand_v = 1)
    mlp_ratio: int = 4        # the MLP's hidden size over d_model (SwiGLU: mlp_hidden_size)
    save_for_backward: Optional[str] = None  # cake's mode for GDN layers (None: the default)
    checkpoint: bool = False  # recompute each block in the backward (torch.utils.checkpoint)


def make_layer(kind: str, config: ModelConfig, impl: str, layer_idx: int) -> nn.Module:
    """A "gdn" or "kda" layer from cake.layers (impl "cake") or fla.layers (impl "fla")."""
    if impl == "cake":
        from cake import layers
        extra = {"save_for_backward": config.save_for_backward} if kind == "gdn" else {}
    else:
        from fla import layers
        extra = {}
    cls = layers.GatedDeltaNet if kind == "gdn" else layers.KimiDeltaAttention
    return cls(hidden_size=config.d_model, expand_v=1, head_dim=config.head_dim,
               num_heads=config.num_heads, num_v_heads=config.num_v_heads,
               layer_idx=layer_idx, **extra)


def mlp_hidden_size(d_model: int, ratio: int) -> int:
    """The SwiGLU's hidden size as FLA's models size it: 2/3 of ratio x d_model, rounded up to a
    multiple of 256. Unrounded (2,730 at d_model 1024), cuBLAS falls back to a GEMM of 2-element
    alignment that took 40 of the main job's 106 ms a step on the H100, in both arms."""
    return 256 * -(-int(ratio * d_model * 2 / 3) // 256)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, ratio: int):
        super().__init__()
        hidden = mlp_hidden_size(d_model, ratio)
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, layer: nn.Module, config: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.attn = layer
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.mlp = SwiGLU(config.d_model, config.mlp_ratio)

    def forward(self, x: Tensor, cu_seqlens: Tensor,
                cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
        """x [1, T, d_model] of packed documents (cu_seqlens [N + 1]; cu_seqlens_cpu, where
        given, its host copy for cake's layers)."""
        extra = {} if cu_seqlens_cpu is None else {"cu_seqlens_cpu": cu_seqlens_cpu}
        x = x + self.attn(self.attn_norm(x), cu_seqlens=cu_seqlens, **extra)[0]
        return x + self.mlp(self.mlp_norm(x))


class LanguageModel(nn.Module):
    def __init__(self, config: ModelConfig, impl: str = "cake"):
        super().__init__()
        self.config, self.impl = config, impl
        self.embed = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.blocks = nn.ModuleList(Block(make_layer(kind, config, impl, i), config)
                                    for i, kind in enumerate(config.layers))
        self.norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.head = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, inputs: Tensor, cu_seqlens: Tensor,
                cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
        """inputs [1, T] bytes -> logits [1, T, 256]."""
        x = self.embed(inputs)
        for block in self.blocks:
            if self.config.checkpoint and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, cu_seqlens, cu_seqlens_cpu,
                                                      use_reentrant=False)
            else:
                x = block(x, cu_seqlens, cu_seqlens_cpu)
        return self.head(self.norm(x))

    def loss(self, inputs: Tensor, targets: Tensor, cu_seqlens: Tensor,
             cu_seqlens_cpu: Optional[Tensor] = None) -> Tensor:
        """Mean cross-entropy of the next byte, in nats."""
        logits = self.forward(inputs, cu_seqlens, cu_seqlens_cpu)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
