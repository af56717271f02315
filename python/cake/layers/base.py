"""What GatedDeltaNet and KimiDeltaAttention share: flash-linear-attention 0.6.0's common
constructor arguments, the q/k/v projections with their short convolutions, and the forward's
frame (padding to packed documents, output projection, the returned triple).

A layer's forward, with D = hidden_size, H = num_heads, HV = num_v_heads, K = head_dim,
V = head_dim * expand_v, and T tokens packed in one sequence:
    x [1, T, D] -> q, k [1, T, H, K], v [1, T, HV, V]      (projection, short conv, SiLU)
              -> o [1, T, HV, V]                            (the delta rule: the subclass)
              -> o_norm (gated by g_proj(x) where the layer has it), o_proj -> [1, T, D]
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kcp import Context
from .conv import ShortConvolution
from .packing import repad, unpad


def inverse_softplus_of_random_dt(n: int) -> Tensor:
    """dt_bias's initial value [n]: softplus^-1(dt) for dt log-uniform in [0.001, 0.1] (at least
    1e-4), so that softplus(dt_bias) starts as a step size of that range (Mamba's init)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    dt = dt.clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


class DeltaLayer(nn.Module):
    """The shared frame; subclasses define ``_delta_rule`` and ``_output_norm``."""

    def __init__(self, hidden_size: int, expand_v: float, head_dim: int, num_heads: int,
                 num_v_heads: Optional[int], mode: str, use_short_conv: bool,
                 allow_neg_eigval: bool, conv_size: int, conv_bias: bool,
                 layer_idx: Optional[int], norm_eps: float):
        super().__init__()
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"mode must be 'chunk' or 'fused_recurrent', got {mode!r}")
        self.mode = mode
        self.hidden_size, self.expand_v, self.head_dim = hidden_size, expand_v, head_dim
        self.num_heads = num_heads
        self.num_v_heads = num_heads if num_v_heads is None else num_v_heads
        self.use_short_conv, self.conv_size, self.conv_bias = use_short_conv, conv_size, conv_bias
        self.allow_neg_eigval, self.layer_idx, self.norm_eps = allow_neg_eigval, layer_idx, norm_eps
        self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        self.key_dim = num_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        if not math.isclose(head_dim * expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError(f"head_dim * expand_v must be an integer, got {head_dim} * "
                             f"{expand_v} = {head_dim * expand_v}")
        if self.num_v_heads % num_heads != 0:
            raise ValueError(f"num_v_heads={self.num_v_heads} must be a multiple of "
                             f"num_heads={num_heads}")

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)

    def _add_short_convs(self) -> None:
        """The q/k/v short convolutions; each subclass adds them where FLA's layer does, so that
        a seed gives both the same initial weights."""
        if self.use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, self.conv_size, bias=self.conv_bias)
            self.k_conv1d = ShortConvolution(self.key_dim, self.conv_size, bias=self.conv_bias)
            self.v_conv1d = ShortConvolution(self.value_dim, self.conv_size, bias=self.conv_bias)

    def _short_conv_qkv(self, x: Tensor, cu_seqlens: Optional[Tensor], cp_context):
        """q, k [B, T, H, K] and v [B, T, HV, V]: projected, convolved per document, SiLU."""
        if self.use_short_conv:
            conv = dict(cu_seqlens=cu_seqlens, cp_context=cp_context)
            q, _ = self.q_conv1d(self.q_proj(x), **conv)
            k, _ = self.k_conv1d(self.k_proj(x), **conv)
            v, _ = self.v_conv1d(self.v_proj(x), **conv)
        else:
            q, k, v = F.silu(self.q_proj(x)), F.silu(self.k_proj(x)), F.silu(self.v_proj(x))
        return (q.unflatten(-1, (-1, self.head_k_dim)), k.unflatten(-1, (-1, self.head_k_dim)),
                v.unflatten(-1, (-1, self.head_v_dim)))

    def _delta_rule(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                    cp_context) -> Tensor:
        """o [B, T, HV, V] of the layer's op on the packed x [B, T, D] (with cp_context, the
        context-parallel op on the rank's shard)."""
        raise NotImplementedError

    def _output_norm(self, x: Tensor, o: Tensor) -> Tensor:
        """o [B, T, HV, V] normalised per head (and gated from x where the layer has a gate)."""
        raise NotImplementedError

    def forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None,
                past_key_values=None, use_cache: Optional[bool] = False,
                output_attentions: Optional[bool] = False, **kwargs):
        """flash-linear-attention's forward, for training.

        Args:
            hidden_states: ``[B, T, hidden_size]``.
            attention_mask: optional ``[B, T]``, 0 at padding: the rows become packed documents.
            past_key_values, use_cache: the inference cache, not supported (NotImplementedError).
            output_attentions: ignored (there are no attention weights), as in FLA.
            cu_seqlens (keyword): ``[N + 1]`` offsets of documents packed in ``B = 1`` rows;
                no state crosses a document boundary (nor does the short convolution).
            cu_seqlens_cpu (keyword): the host copy of cu_seqlens, with which the delta rule
                walks few long documents as exact segments on the GPU where cake's plan
                predicts a gain (``cake.chunk_gated_delta_rule``'s argument of that name).
            cp_context (keyword): a ``cake.kcp.Context``: hidden_states is this rank's shard
                ``[1, T_local, hidden_size]`` of a context-parallel batch (``cake.kcp.shard``);
                the short convolutions and the delta rule pass what crosses ranks exactly. Every
                rank of the context must call the layer, and its backward, in the same order.
                The parameters' gradients are this rank's partial sums: all-reduce them over the
                context's ranks, as data-parallel gradients are.

        Returns:
            ``(o [B, T, hidden_size], None, past_key_values)``.
        """
        if past_key_values is not None or use_cache:
            raise NotImplementedError(
                f"{type(self).__name__} (cake) is a training layer: no inference cache "
                "(past_key_values, use_cache=True) yet; use flash-linear-attention's layer for "
                "generation (it loads this layer's state dict)")
        batch_size, seq_len, _ = hidden_states.shape
        cp_context = kwargs.get("cp_context")
        cu_seqlens_cpu = kwargs.get("cu_seqlens_cpu")
        if cp_context is not None:
            _check_context(type(self).__name__, cp_context, hidden_states, attention_mask,
                           kwargs.get("cu_seqlens"), cu_seqlens_cpu)
        x, indices, cu_seqlens = unpad(hidden_states, attention_mask, kwargs.get("cu_seqlens"))
        if attention_mask is not None:  # its documents' offsets live on the device only
            cu_seqlens_cpu = None
        q, k, v = self._short_conv_qkv(x, cu_seqlens, cp_context)
        o = self._output_norm(x, self._delta_rule(x, q, k, v, cu_seqlens, cu_seqlens_cpu,
                                                  cp_context))
        o = self.o_proj(o.flatten(-2))
        return repad(o, indices, batch_size, seq_len), None, past_key_values


def _check_context(layer: str, ctx, hidden_states: Tensor, attention_mask, cu_seqlens,
                   cu_seqlens_cpu) -> None:
    """What a context-parallel call needs: a cake.kcp.Context, the rank's packed shard, and
    neither a mask nor cu_seqlens (the context gives the rank's documents)."""
    if not isinstance(ctx, Context):
        raise ValueError(f"{layer}: cp_context must be a cake.kcp.Context (cake.kcp.build_context),"
                         f" got {type(ctx).__name__}")
    if attention_mask is not None or cu_seqlens is not None or cu_seqlens_cpu is not None:
        raise ValueError(f"{layer}: with cp_context, pass neither attention_mask nor cu_seqlens "
                         f"(nor cu_seqlens_cpu): the context gives this rank's documents")
    if hidden_states.shape[0] != 1 or hidden_states.shape[1] != ctx.num_tokens:
        raise ValueError(f"{layer}: with cp_context, hidden_states must be this rank's shard "
                         f"[1, T_local = {ctx.num_tokens}, hidden_size] (cake.kcp.shard), got "
                         f"{list(hidden_states.shape)}")
