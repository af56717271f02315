"""Padded batches to packed documents and back, as flash-linear-attention's layers do.

A batch ``[B, T, ...]`` with an ``attention_mask [B, T]`` (1 for a token, 0 for padding) becomes
one packed sequence ``[1, total, ...]`` of the B documents and its ``cu_seqlens [B + 1]``; the
layer's output is scattered back to ``[B, T, ...]`` with zeros at the padding.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def unpad(x: Tensor, attention_mask: Optional[Tensor],
          cu_seqlens: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """(x packed [1, total, ...], the kept tokens' indices into [B * T] or None, cu_seqlens).

    Explicit cu_seqlens win: x is then already packed and comes back unchanged, as it does
    without a mask.
    """
    if cu_seqlens is not None or attention_mask is None:
        return x, None, cu_seqlens
    batch_size, seq_len = x.shape[:2]
    if (attention_mask.dim() != 2 or attention_mask.shape[0] != batch_size
            or attention_mask.shape[1] < seq_len):
        raise ValueError(f"attention_mask must be [batch_size, seq_len] = [{batch_size}, "
                         f">= {seq_len}] of 0 (padding) and 1, got shape "
                         f"{list(attention_mask.shape)}")
    # A longer mask (past tokens' columns first, as FLA takes it): the last seq_len columns.
    attention_mask = attention_mask[:, -seq_len:]
    keep = attention_mask.bool().flatten()
    indices = keep.nonzero().squeeze(-1)
    lengths = attention_mask.bool().sum(-1, dtype=torch.int32)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    packed = x.reshape(-1, *x.shape[2:])[indices].unsqueeze(0)
    return packed, indices, cu_seqlens


def repad(o: Tensor, indices: Optional[Tensor], batch_size: int, seq_len: int) -> Tensor:
    """o [1, total, ...] back to [batch_size, seq_len, ...] (zeros at padding); unchanged when
    unpad kept x as it was (indices None)."""
    if indices is None:
        return o
    full = o.new_zeros(batch_size * seq_len, *o.shape[2:])
    return full.index_copy(0, indices, o.squeeze(0)).reshape(batch_size, seq_len, *o.shape[2:])
