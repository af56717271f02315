"""``GatedDeltaNet``: flash-linear-attention 0.6.0's ``fla.layers.GatedDeltaNet`` on cake's op.

Same constructor, parameter names and shapes (an FLA layer's state dict loads unchanged), and
forward. The gate and beta are computed from x per token and value head:
    g    = -exp(A_log) * softplus(a_proj(x) + dt_bias)     natural-log decay, [B, T, HV]
    beta = sigmoid(b_proj(x))  (times 2 with allow_neg_eigval)
by the op (``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``, as FLA calls it; on CUDA
tensors a kernel of the op computes them before the delta rule's, or torch where the call is
routed to exact segments through cake.kcp).
"""

from functools import partial
from typing import Optional

import torch
from torch import Tensor, nn

from ..api import chunk_gated_delta_rule
from ..kcp import chunk_gated_delta_rule_kcp
from ..options import SAVE_MODES
from .base import DeltaLayer, inverse_softplus_of_random_dt
from .norm import FusedRMSNormGated, RMSNorm


class GatedDeltaNet(DeltaLayer):
    """Gated DeltaNet layer (Yang et al., https://arxiv.org/abs/2412.06464).

    Args (flash-linear-attention's, with its defaults):
        hidden_size: D, 2048. expand_v: V = head_dim * expand_v, 2. head_dim: K, 256.
        num_heads: H, the q/k heads, 6. num_v_heads: HV, value heads (a multiple of H), H.
        mode: "chunk" or "fused_recurrent": accepted; cake always runs its chunked op (the same
            result). use_gate: the output gate g_proj with FusedRMSNormGated (else RMSNorm),
            True. use_short_conv: q/k/v short convolutions, True. allow_neg_eigval: beta in
            (0, 2), False. conv_size: 4. conv_bias: False. layer_idx: None. norm_eps: 1e-5.
        output_gate_activation: "swish" (= "silu") or "sigmoid", "swish".
        save_for_backward (cake's own): what the CUDA forward keeps for the backward,
            "inverse", "saved" or "recompute" (``cake.chunk_gated_delta_rule``); None follows
            ``cake.set_default_save_for_backward``. Also settable later as an attribute.

    On CUDA tensors cake's kernels need bfloat16 q, k, v (the projections' dtype: a bfloat16
    model or ``torch.autocast``) and head_dim * expand_v = head_dim = 128.

    Parameters: q_proj, k_proj [H*K, D]; v_proj, g_proj [HV*V, D]; a_proj, b_proj [HV, D];
    A_log, dt_bias [HV]; q_conv1d, k_conv1d [H*K, 1, conv_size], v_conv1d [HV*V, 1, conv_size];
    o_norm.weight [V]; o_proj [D, HV*V].
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 2, head_dim: int = 256,
                 num_heads: int = 6, num_v_heads: Optional[int] = None, mode: str = "chunk",
                 use_gate: bool = True, use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, conv_bias: bool = False,
                 layer_idx: Optional[int] = None, norm_eps: float = 1e-5,
                 output_gate_activation: str = "swish", save_for_backward: Optional[str] = None,
                 **kwargs):
        super().__init__(hidden_size, expand_v, head_dim, num_heads, num_v_heads, mode,
                         use_short_conv, allow_neg_eigval, conv_size, conv_bias, layer_idx,
                         norm_eps)
        if save_for_backward is not None and save_for_backward not in SAVE_MODES:
            raise ValueError(f"save_for_backward must be None or one of {sorted(SAVE_MODES)}, "
                             f"got {save_for_backward!r}")
        self.save_for_backward = save_for_backward
        self.use_gate = use_gate
        HV = self.num_v_heads
        self.a_proj = nn.Linear(hidden_size, HV, bias=False)
        self.b_proj = nn.Linear(hidden_size, HV, bias=False)
        # A = exp(A_log) uniform in (0, 16]: the decay rate's scale per value head.
        self.A_log = nn.Parameter(torch.log(torch.empty(HV).uniform_(0, 16)))
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(inverse_softplus_of_random_dt(HV))
        self.dt_bias._no_weight_decay = True
        self._add_short_convs()
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.o_norm = FusedRMSNormGated(self.head_v_dim, eps=norm_eps,
                                            activation=output_gate_activation)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _delta_rule(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                    cp_context) -> Tensor:
        a, b = self.a_proj(x), self.b_proj(x)                              # [B, T, HV] each
        if cp_context is not None:
            op = partial(chunk_gated_delta_rule_kcp, ctx=cp_context)
        else:
            op = partial(chunk_gated_delta_rule, cu_seqlens=cu_seqlens,
                         cu_seqlens_cpu=cu_seqlens_cpu, save_for_backward=self.save_for_backward)
        o, _ = op(q, k, v, a, b, A_log=self.A_log, dt_bias=self.dt_bias, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, allow_neg_eigval=self.allow_neg_eigval,
                  use_qk_l2norm_in_kernel=True)
        return o

    def _output_norm(self, x: Tensor, o: Tensor) -> Tensor:
        if not self.use_gate:
            return self.o_norm(o)
        return self.o_norm(o, self.g_proj(x).unflatten(-1, (-1, self.head_v_dim)))
