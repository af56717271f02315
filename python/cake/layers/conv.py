"""The short causal convolution of the layers: flash-linear-attention's ``ShortConvolution`` on
``cake.causal_conv1d`` (packed documents, no token reading across a document boundary; the FP64
reference on CPU tensors, the kernels on CUDA tensors), or on ``cake.kcp.causal_conv1d_kcp`` for
a rank's shard of a context-parallel batch.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from ..conv1d import causal_conv1d
from ..kcp import causal_conv1d_kcp


class ShortConvolution(nn.Conv1d):
    """flash-linear-attention's ``ShortConvolution``: a depthwise causal convolution with the same
    parameters (``weight [D, 1, W]``, ``bias [D]``), constructor and forward. ``backend`` is
    accepted ("triton" or "cuda", as FLA's) and cake's kernels run either way."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: Optional[str] = "silu", backend: Optional[str] = "triton",
                 device=None, dtype=None, **kwargs):
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=bias, device=device, dtype=dtype)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
        if backend not in ("triton", "cuda"):
            raise ValueError(f"backend must be 'triton' or 'cuda', got {backend!r}")
        self.hidden_size = hidden_size
        self.activation = activation
        self.backend = backend

    @property
    def state_size(self) -> int:
        return self.hidden_size * self.kernel_size[0]

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                cache: Optional[Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None,
                cp_context=None, **kwargs) -> tuple[Tensor, Optional[Tensor]]:
        """x ``[B, T, D]`` (B = 1 with cu_seqlens); mask ``[B, T]`` zeroes padded inputs (not
        with cu_seqlens); cache ``[N, D, W]`` is the initial state. Returns ``(y [B, T, D],
        final_state [N, D, W] or None)``. As FLA's, a call without autograd of one token per
        sequence is a decoding step: it updates cache in place (a zero cache where None). With
        ``cp_context`` (a ``cake.kcp.Context``), x is the rank's shard ``[1, T_local, D]`` and the
        halo comes from the ranks before (no mask, cache or final state). chunk_indices: FLA's
        hint, accepted and unused."""
        weight = self.weight.squeeze(1)
        if cp_context is not None:
            if mask is not None or cache is not None or output_final_state:
                raise ValueError("mask, cache and output_final_state are not supported with "
                                 "cp_context")
            return causal_conv1d_kcp(x, weight, self.bias, residual, self.activation,
                                     ctx=cp_context)
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("mask and cu_seqlens cannot be given together")
            x = x * mask.unsqueeze(-1).to(x.dtype)
        B, T = x.shape[:2]
        N = B if cu_seqlens is None else cu_seqlens.numel() - 1
        if (not torch.is_grad_enabled() and B * T == N
                and (cu_seqlens is None or bool((cu_seqlens.diff() == 1).all()))):
            if cache is None:
                cache = x.new_zeros(N, self.hidden_size, self.kernel_size[0])
            y, final = causal_conv1d(x, weight, self.bias, residual, cache, True,
                                     self.activation, cu_seqlens=cu_seqlens)
            cache.copy_(final)
            return y, (cache if output_final_state else None)
        return causal_conv1d(x, weight, self.bias, residual=residual, initial_state=cache,
                             output_final_state=output_final_state, activation=self.activation,
                             cu_seqlens=cu_seqlens)
