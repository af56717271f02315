"""``KimiDeltaAttention``: flash-linear-attention 0.6.0's ``fla.layers.KimiDeltaAttention`` on
cake's op.

Same constructor, parameter names and shapes (an FLA layer's state dict loads unchanged), and
forward. The decay is per value head and key channel, from a low-rank projection of x, computed
inside the op (``use_gate_in_kernel``):
    g    = -exp(A_log) * softplus(f_proj(x) + dt_bias)           [B, T, HV, K]
           (lower_bound * sigmoid(exp(A_log) * (f_proj(x) + dt_bias)) with lower_bound)
    beta = sigmoid(b_proj(x))  (times 2 with allow_neg_eigval)

On CUDA tensors a kernel of the op computes both before the delta rule's (src/kernels/gate); a
call routed to exact segments (``cu_seqlens_cpu``, through cake.kcp) computes them in torch.
"""

from functools import partial
from typing import Optional

import torch
from torch import Tensor, nn

from ..api import chunk_kda
from ..kcp import chunk_kda_kcp
from .base import DeltaLayer, inverse_softplus_of_random_dt
from .norm import FusedRMSNormGated


class KimiDeltaAttention(DeltaLayer):
    """Kimi Delta Attention layer (Kimi Linear, https://arxiv.org/abs/2510.26692).

    Args (flash-linear-attention's, with its defaults):
        hidden_size: D, 2048. expand_v: V = head_dim * expand_v, 1. head_dim: K, 128.
        num_heads: H, the q/k heads, 16. num_v_heads: HV, value heads (a multiple of H), H.
        mode: "chunk" or "fused_recurrent": accepted; cake always runs its chunked op.
        use_short_conv: True. allow_neg_eigval: beta in (0, 2), False.
        safe_gate: a promise that the gate stays in [lower_bound, 0) (needs lower_bound), False.
        lower_bound: the lower-bound gate above, None. conv_size: 4. conv_bias: False.
        layer_idx: None. norm_eps: 1e-5.

    Parameters: q_proj, k_proj [H*K, D]; v_proj [HV*V, D]; q_conv1d, k_conv1d
    [H*K, 1, conv_size], v_conv1d [HV*V, 1, conv_size]; f_proj.0 [V, D], f_proj.1 [HV*K, V];
    b_proj [HV, D]; A_log [HV]; dt_bias [HV*K]; g_proj.0 [V, D], g_proj.1 [HV*V, V] with bias
    [HV*V]; o_norm.weight [V] (sigmoid gate); o_proj [D, HV*V].
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128,
                 num_heads: int = 16, num_v_heads: Optional[int] = None, mode: str = "chunk",
                 use_short_conv: bool = True, allow_neg_eigval: bool = False,
                 safe_gate: bool = False, lower_bound: Optional[float] = None,
                 conv_size: int = 4, conv_bias: bool = False, layer_idx: Optional[int] = None,
                 norm_eps: float = 1e-5, **kwargs):
        super().__init__(hidden_size, expand_v, head_dim, num_heads, num_v_heads, mode,
                         use_short_conv, allow_neg_eigval, conv_size, conv_bias, layer_idx,
                         norm_eps)
        self._add_short_convs()
        self.safe_gate, self.lower_bound = safe_gate, lower_bound
        self.gate_dim = self.num_v_heads * self.head_k_dim
        # Low rank (through V) projections of the decay and of the output gate.
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.gate_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        # With safe_gate the lower-bound gate starts at exp(A_log) = 1; else A in [1, 16].
        A = (torch.ones(self.num_v_heads) if safe_gate
             else torch.empty(self.num_v_heads).uniform_(1, 16))
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(inverse_softplus_of_random_dt(self.gate_dim))
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.value_dim, bias=True))
        self.o_norm = FusedRMSNormGated(self.head_v_dim, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _delta_rule(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                    cp_context) -> Tensor:
        f = self.f_proj(x).unflatten(-1, (-1, self.head_k_dim))            # [B, T, HV, K]
        b = self.b_proj(x)                                                 # [B, T, HV]
        op = (partial(chunk_kda, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
              if cp_context is None else partial(chunk_kda_kcp, ctx=cp_context))
        o, _ = op(q, k, v, f, b, A_log=self.A_log, dt_bias=self.dt_bias,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, allow_neg_eigval=self.allow_neg_eigval,
                  safe_gate=self.safe_gate, lower_bound=self.lower_bound)
        return o

    def _output_norm(self, x: Tensor, o: Tensor) -> Tensor:
        return self.o_norm(o, self.g_proj(x).unflatten(-1, (-1, self.head_v_dim)))
