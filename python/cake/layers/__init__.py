"""flash-linear-attention-compatible layers on cake's ops.

    from cake.layers import GatedDeltaNet, KimiDeltaAttention   # instead of: from fla.layers ...

Same constructor arguments, parameter names and shapes as flash-linear-attention 0.6.0's layers
(a state dict of one loads into the other), and the same forward (``cu_seqlens`` for packed
documents, ``attention_mask`` for padded batches). Training only: no inference cache yet.
"""

from .conv import ShortConvolution, causal_conv1d
from .gated_deltanet import GatedDeltaNet
from .kda import KimiDeltaAttention
from .norm import FusedRMSNormGated, RMSNorm

__all__ = ["FusedRMSNormGated", "GatedDeltaNet", "KimiDeltaAttention", "RMSNorm",
           "ShortConvolution", "causal_conv1d"]
