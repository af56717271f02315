"""An independent plain-torch FP64 reference: the delta-rule recurrence, one token at a time.

Written from the maths, not from cake's code, and built only from differentiable torch ops, so that
torch.autograd gives the reference gradients (dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias) against
which cake's analytic backward is compared.

Per document and value head, with S (K x V) from initial_state or 0:
    Sbar = D_t S              D_t = exp(g_t) (GDN) or Diag(exp(g_t)) (KDA)
    S    = Sbar + k_t (beta_t (v_t - Sbar^T k_t))^T
    o_t  = scale * S^T q_t
"""

from typing import Optional

import torch
from torch import Tensor


def l2norm(x: Tensor) -> Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def softplus(x: Tensor) -> Tensor:
    return torch.logaddexp(x, torch.zeros_like(x))  # log(1 + e^x), stable, exact gradient


def gate(g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], lower_bound, kda: bool):
    """The in-op gate: g [B, T, HV] (GDN) or [B, T, HV, K] (KDA) -> natural-log decay."""
    HV = g.shape[2]
    x = g
    if dt_bias is not None:
        x = x + (dt_bias.reshape(HV, -1) if kda else dt_bias)
    a = None
    if A_log is not None:
        a = torch.exp(A_log)
        if kda:
            a = a[:, None]
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(x if a is None else a * x)
    return -a * softplus(x)


def recurrence(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, kda: bool,
               scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
               output_final_state: bool = False, cu_seqlens: Optional[Tensor] = None,
               use_qk_l2norm: bool = False, use_gate_in_kernel: bool = False,
               A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
               lower_bound: Optional[float] = None, use_beta_sigmoid: bool = False,
               allow_neg_eigval: bool = False):
    """Returns (o [B, T, HV, V] float64, final_state [N, HV, K, V] float64 or None).

    Inputs may be any float dtype; they are computed in float64. States are [N, HV, K, V].
    """
    f64 = lambda t: None if t is None else t.to(torch.float64)  # noqa: E731
    q, k, v, g, beta = map(f64, (q, k, v, g, beta))
    initial_state, A_log, dt_bias = map(f64, (initial_state, A_log, dt_bias))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if scale is None:
        scale = K ** -0.5
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if use_gate_in_kernel:
        g = gate(g, A_log, dt_bias, lower_bound, kda)
    if use_beta_sigmoid:
        beta = (2.0 if allow_neg_eigval else 1.0) * torch.sigmoid(beta)
    # grouped value heads: value head hv reads q/k head hv // (HV // H)
    q = q.repeat_interleave(HV // H, dim=2)
    k = k.repeat_interleave(HV // H, dim=2)

    # documents as [start, end) ranges of the flattened [B * T] token axis
    if cu_seqlens is not None:
        assert B == 1
        cu = [int(x) for x in cu_seqlens.tolist()]
    else:
        cu = [b * T for b in range(B + 1)]
    q, k, v, beta = (x.reshape(B * T, *x.shape[2:]) for x in (q, k, v, beta))
    g = g.reshape(B * T, *g.shape[2:])

    outputs, finals = [], []
    for n in range(len(cu) - 1):
        if initial_state is not None:
            S = initial_state[n]
        else:
            S = q.new_zeros(HV, K, V)
        for t in range(cu[n], cu[n + 1]):
            decay = torch.exp(g[t])                                  # [HV] or [HV, K]
            Sbar = S * (decay[:, :, None] if kda else decay[:, None, None])
            pred = torch.einsum("hkv,hk->hv", Sbar, k[t])            # Sbar^T k_t
            u = beta[t][:, None] * (v[t] - pred)                     # [HV, V]
            S = Sbar + k[t][:, :, None] * u[:, None, :]
            outputs.append(scale * torch.einsum("hkv,hk->hv", S, q[t]))
        finals.append(S)
    if outputs:
        o = torch.stack(outputs).reshape(B, T, HV, V)
    else:
        o = v.new_zeros(B, T, HV, V)
    final_state = torch.stack(finals) if output_final_state else None
    return o, final_state
