"""The short causal convolution of the layers: flash-linear-attention's ``ShortConvolution`` on
``cake.causal_conv1d`` (packed documents, no token reading across a document boundary; the FP64
reference on CPU tensors, the kernels on CUDA tensors), or on ``cake.kcp.causal_conv1d_kcp`` for
a rank's shard of a context-parallel batch.
"""

from typing import Optional

from torch import Tensor, nn

from ..conv1d import causal_conv1d
from ..kcp import causal_conv1d_kcp


class ShortConvolution(nn.Conv1d):
    """flash-linear-attention's ``ShortConvolution``: a depthwise causal convolution with the same
    parameters (``weight [D, 1, W]``, ``bias [D]``), constructor and forward."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: Optional[str] = "silu", device=None, dtype=None, **kwargs):
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=bias, device=device, dtype=dtype)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
        self.hidden_size = hidden_size
        self.activation = activation

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                cache: Optional[Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[Tensor] = None, cp_context=None,
                **kwargs) -> tuple[Tensor, Optional[Tensor]]:
        """x ``[B, T, D]`` (B = 1 with cu_seqlens); mask ``[B, T]`` zeroes padded inputs; cache
        ``[N, D, W]`` is the initial state. Returns ``(y [B, T, D], final_state [N, D, W] or
        None)``. With ``cp_context`` (a ``cake.kcp.Context``), x is the rank's shard
        ``[1, T_local, D]`` and the halo comes from the ranks before (no mask, cache or
        final state)."""
        if cp_context is not None:
            return causal_conv1d_kcp(x, self.weight.squeeze(1), self.bias, residual,
                                     self.activation, ctx=cp_context)
        if mask is not None:
            x = x * mask.unsqueeze(-1).to(x.dtype)
        return causal_conv1d(x, self.weight.squeeze(1), self.bias, residual=residual,
                             initial_state=cache, output_final_state=output_final_state,
                             activation=self.activation, cu_seqlens=cu_seqlens)
