"""The output norms of the layers: flash-linear-attention's ``RMSNorm`` and
``FusedRMSNormGated``, with the same parameters, on cake's fused op (``cake.norm``).

Both normalise over the last dimension (a head's V values) in float32 on CUDA (float64 on the
CPU) and return the input's dtype:  y = x / sqrt(mean(x^2) + eps) * weight, times act(gate) for
the gated form, with act swish (x * sigmoid(x), also named silu) or sigmoid.
"""

import torch
from torch import Tensor, nn

from ..norm import ACTIVATIONS, rms_norm_gated


class RMSNorm(nn.Module):
    """``weight [hidden_size]`` (ones), no bias."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 device=None, dtype=None):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = (nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm_gated(x, None, self.weight, self.eps)


class FusedRMSNormGated(nn.Module):
    """RMSNorm times act(g): ``weight [hidden_size]`` (ones), act "swish"/"silu" or "sigmoid"."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got "
                             f"{activation!r}")
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.weight = (nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        """x, g: ``[..., hidden_size]``; returns x's shape and dtype (g is cast to x's dtype)."""
        return rms_norm_gated(x, g, self.weight, self.eps, self.activation)
