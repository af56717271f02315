"""The short causal convolution of the layers, over packed documents.

``causal_conv1d`` has the signature and semantics of ``cake.causal_conv1d`` (flash-linear-
attention's ``causal_conv1d``); it is written here in plain torch until cake's own op is merged,
and it is the only place the layers call a convolution: swapping in ``cake.causal_conv1d`` is
changing the one call in ``ShortConvolution.forward``.

Per document and channel d, with W taps and the document's inputs x_0, x_1, ...:
    y_t = act(bias_d + sum_{i < W} weight[d, i] * x_{t - W + 1 + i}) + residual_t
where x_s for s < 0 is column W + s of the document's initial state (zeros without one): no
token reads across a document boundary.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _document_positions(cu_seqlens: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """(document index, position inside its document) of each of the total tokens, both [total]."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    doc = torch.searchsorted(cu_seqlens[1:].long(), tokens, right=True)
    return doc, tokens - cu_seqlens.long()[doc]


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  residual: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                  output_final_state: bool = False, activation: Optional[str] = None,
                  cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """Depthwise causal convolution of packed documents.

    Args:
        x: ``[B, T, D]``; with ``cu_seqlens`` B = 1, else each batch row is one document.
        weight: ``[D, W]``. bias: ``[D]``. residual: ``[B, T, D]``, added after the activation.
        initial_state: ``[N, D, W]``, the W inputs before each document (the last column the
            most recent); N documents.
        output_final_state: also return each document's last W inputs, ``[N, D, W]`` (earlier
            columns from the initial state, or zeros, for documents shorter than W).
        activation: None, ``"silu"`` or ``"swish"`` (the same function).
        cu_seqlens: ``[N + 1]`` offsets of the packed documents.

    Returns:
        ``(y [B, T, D] in x's dtype, final_state [N, D, W] in x's dtype or None)``.
    """
    B, T, D = x.shape
    W = weight.shape[-1]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (B + 1) * T, T, device=x.device)
    elif B != 1:
        raise ValueError(f"causal_conv1d: cu_seqlens requires B = 1, got B = {B}")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"causal_conv1d: activation must be None, 'silu' or 'swish', got "
                         f"{activation!r}")
    # Sums in float32 at least (float64 stays float64), as FLA's kernel accumulates.
    compute = torch.promote_types(x.dtype, torch.float32)
    flat = x.reshape(B * T, D).to(compute)                               # [T', D], T' = B * T
    doc, pos = _document_positions(cu_seqlens, B * T)
    acc = flat * weight[:, W - 1].to(compute)
    for shift in range(1, W):
        # x_{t - shift}: the token `shift` places back when it is in the same document, else the
        # initial state's column W - shift + pos (or zero).
        earlier = F.pad(flat, (0, 0, shift, 0))[: B * T]
        inside = (pos >= shift).unsqueeze(-1)
        if initial_state is None:
            earlier = earlier * inside
        else:
            column = (W - shift + pos).clamp(max=W - 1)
            from_state = initial_state[doc, :, column].to(compute)       # [T', D]
            earlier = torch.where(inside, earlier, from_state)
        acc = acc + earlier * weight[:, W - 1 - shift].to(compute)
    if bias is not None:
        acc = acc + bias.to(compute)
    if activation is not None:
        acc = F.silu(acc)
    y = acc.to(x.dtype).reshape(B, T, D)
    if residual is not None:
        y = y + residual
    if not output_final_state:
        return y, None
    return y, _final_state(flat, cu_seqlens, initial_state, W).to(x.dtype)


def _final_state(flat: Tensor, cu_seqlens: Tensor, initial_state: Optional[Tensor],
                 W: int) -> Tensor:
    """Each document's last W inputs, [N, D, W]: token end - W + j in column j, or, before the
    document's start, the initial state's column W + (that token's offset from the start)."""
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    offsets = torch.arange(-W, 0, device=flat.device)
    token = ends[:, None] + offsets                                       # [N, W]
    inside = token >= starts[:, None]
    from_x = flat[token.clamp(min=0)]                                     # [N, W, D]
    if initial_state is None:
        from_before = torch.zeros_like(from_x)
    else:
        column = (W + token - starts[:, None]).clamp(min=0, max=W - 1)    # [N, W]
        docs = torch.arange(len(starts), device=flat.device)[:, None]
        from_before = initial_state[docs, :, column].to(flat.dtype)       # [N, W, D]
    return torch.where(inside.unsqueeze(-1), from_x, from_before).transpose(1, 2)


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
                cu_seqlens: Optional[Tensor] = None, **kwargs) -> tuple[Tensor, Optional[Tensor]]:
        """x ``[B, T, D]`` (B = 1 with cu_seqlens); mask ``[B, T]`` zeroes padded inputs; cache
        ``[N, D, W]`` is the initial state. Returns ``(y [B, T, D], final_state [N, D, W] or
        None)``."""
        if mask is not None:
            x = x * mask.unsqueeze(-1).to(x.dtype)
        return causal_conv1d(x, self.weight.squeeze(1), self.bias, residual=residual,
                             initial_state=cache, output_final_state=output_final_state,
                             activation=self.activation, cu_seqlens=cu_seqlens)
