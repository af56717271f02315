"""The output norms of the layers: flash-linear-attention's ``RMSNorm`` and
``FusedRMSNormGated``, with the same parameters, in plain torch.

Both normalise over the last dimension (a head's V values) in float32 (float64 stays float64)
and return the input's dtype:  y = x / sqrt(mean(x^2) + eps) * weight, times act(gate) for the
gated form, with act swish (x * sigmoid(x), also named silu) or sigmoid.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_GATE_ACTIVATIONS = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


def _rms_normalise(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in float32 at least."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(x.dtype)


class RMSNorm(nn.Module):
    """``weight [hidden_size]`` (ones), no bias."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 device=None, dtype=None):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = (nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x: Tensor) -> Tensor:
        return _rms_normalise(x, self.weight, self.eps).to(x.dtype)


class FusedRMSNormGated(nn.Module):
    """RMSNorm times act(g): ``weight [hidden_size]`` (ones), act "swish"/"silu" or "sigmoid"."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None):
        super().__init__()
        if activation not in _GATE_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_GATE_ACTIVATIONS)}, got "
                             f"{activation!r}")
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.weight = (nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        """x, g: ``[..., hidden_size]``; returns x's shape and dtype."""
        gate = _GATE_ACTIVATIONS[self.activation](g.to(torch.promote_types(g.dtype, torch.float32)))
        return (_rms_normalise(x, self.weight, self.eps) * gate).to(x.dtype)
