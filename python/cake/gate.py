"""The in-op gate and beta's sigmoid in torch, for cake.kcp on CUDA tensors.

Under context parallelism the summaries of the fragments and the ranks' calls all read the
activated g and beta, so ``use_gate_in_kernel`` and ``use_beta_sigmoid_in_kernel`` are computed
once here, in float32 with autograd (so A_log, dt_bias and the raw g and beta get their
gradients), by the formulas of the FP64 reference (src/ref/preprocess.cpp; float64 stays
float64), and the rest gets the activated g and beta with those options off (the single-rank op
computes them in a kernel of its own, src/kernels/gate):

    g    <- -exp(A_log) * softplus(g + dt_bias)                  (exp(A_log) = 1 without A_log)
    g    <- lower_bound * sigmoid(exp(A_log) * (g + dt_bias))    (KDA with lower_bound)
    beta <- c * sigmoid(beta),  c = 2 with allow_neg_eigval, else 1

dt_bias is [HV] (GDN) or [HV * K] (KDA, a bias per key channel). The shapes are checked first,
with the C++ validation's messages: a g of the wrong shape would otherwise broadcast against
dt_bias into one of the right shape.
"""

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .options import KDA, DeltaOptions


def _at_least_float32(t: Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _shape_error(name: str, t: Tensor, expected: tuple, meaning: str) -> Optional[str]:
    if tuple(t.shape) == expected:
        return None
    want = "[" + ", ".join(str(n) for n in expected) + "]"
    got = "[" + ", ".join(str(n) for n in t.shape) + "]"
    return f"{name} must have shape {meaning} = {want}, got {got}"


def _check(opts: DeltaOptions, q: Tensor, v: Tensor, g: Tensor, beta: Tensor,
           A_log: Optional[Tensor], dt_bias: Optional[Tensor]) -> None:
    if q.dim() != 4 or v.dim() != 4:
        return  # the C++ validation names q's or v's rank
    B, T, _, K = q.shape
    HV = v.shape[2]
    kda = opts.variant == KDA
    errors = [_shape_error("g", g, (B, T, HV, K) if kda else (B, T, HV),
                           "[B, T, HV, K]" if kda else "[B, T, HV]"),
              _shape_error("beta", beta, (B, T, HV), "[B, T, HV]")]
    if opts.use_gate_in_kernel:
        if A_log is None and opts.lower_bound is None:
            errors.append("A_log [HV] is required with use_gate_in_kernel=True")
        if A_log is not None:
            errors.append(_shape_error("A_log", A_log, (HV,), "[HV]"))
        if dt_bias is not None:
            errors.append(_shape_error("dt_bias", dt_bias, (HV * K,) if kda else (HV,),
                                       "[HV * K]" if kda else "[HV]"))
    errors = [e for e in errors if e]
    if errors:
        raise ValueError(errors[0])


def _sigmoid_slope(z: Tensor) -> Tensor:
    """sigmoid'(z) = s (1 - s), with 1 - s as sigmoid(-z): 1 - s itself rounds to 0 once s
    rounds to 1 (z above ~17 in float32), where the slope is still ~e^-z. torch's own sigmoid
    backward takes the product as it is."""
    return torch.sigmoid(z) * torch.sigmoid(-z)


class _Gate(torch.autograd.Function):
    """g from the raw gate: -a softplus(x) or lower_bound sigmoid(a x), x = raw + dt_bias,
    a = exp(A_log) (1 without A_log). It keeps only its inputs for the backward, which recomputes
    x and a: autograd through the formula would keep x and softplus(x) in float32, two more
    tensors of g's size per call (for KDA 4 bytes per token, value head and key channel each)."""

    @staticmethod
    def forward(fctx, raw: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                lower_bound: Optional[float], per_head: tuple, per_channel: tuple):
        fctx.save_for_backward(raw, A_log, dt_bias)
        fctx.shapes = (lower_bound, per_head, per_channel)   # for the backward's recompute
        x, a = _gate_input(raw, A_log, dt_bias, per_head, per_channel)
        if lower_bound is not None:
            return lower_bound * torch.sigmoid(a * x)
        return -a * F.softplus(x)

    @staticmethod
    def backward(fctx, dg: Tensor):
        raw, A_log, dt_bias = fctx.saved_tensors
        lower_bound, per_head, per_channel = fctx.shapes
        x, a = _gate_input(raw, A_log, dt_bias, per_head, per_channel)
        if lower_bound is not None:
            slope = lower_bound * _sigmoid_slope(a * x)          # d g / d (a x)
            dx, da_log = dg * slope * a, dg * slope * a * x
        else:
            dx, da_log = dg * (-a * torch.sigmoid(x)), dg * (-a * F.softplus(x))
        d_raw = dx.to(raw.dtype) if fctx.needs_input_grad[0] else None
        dA_log = ddt_bias = None
        if A_log is not None and fctx.needs_input_grad[1]:   # summed over tokens (and channels)
            summed = da_log.flatten(0, 1).sum(0)               # [HV] or [HV, K]
            dA_log = (summed.sum(-1) if summed.dim() == 2 else summed).to(A_log.dtype)
        if dt_bias is not None and fctx.needs_input_grad[2]:  # summed over tokens
            ddt_bias = dx.flatten(0, 1).sum(0).reshape(dt_bias.shape).to(dt_bias.dtype)
        return d_raw, dA_log, ddt_bias, None, None, None


class _BetaSigmoid(torch.autograd.Function):
    """beta = c sigmoid(raw) in at least float32, its backward through _sigmoid_slope."""

    @staticmethod
    def forward(fctx, raw: Tensor, c: float):
        fctx.save_for_backward(raw)
        fctx.c = c
        return raw.to(_at_least_float32(raw)).sigmoid() * c

    @staticmethod
    def backward(fctx, dbeta: Tensor):
        (raw,) = fctx.saved_tensors
        x = raw.to(_at_least_float32(raw))
        return (dbeta * fctx.c * _sigmoid_slope(x)).to(raw.dtype), None


def _gate_input(raw: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                per_head: tuple, per_channel: tuple):
    """(x = raw + dt_bias, a = exp(A_log)) in at least float32, shaped to broadcast against
    raw [B, T, HV(, K)]."""
    x = raw.to(_at_least_float32(raw))
    if dt_bias is not None:
        x = x + dt_bias.to(x.dtype).view(per_channel)
    a = A_log.to(x.dtype).exp().view(per_head) if A_log is not None else 1.0
    return x, a


def in_torch(opts: DeltaOptions, q: Tensor, v: Tensor, g: Tensor, beta: Tensor,
             A_log: Optional[Tensor], dt_bias: Optional[Tensor]):
    """(options without the in-op gate and sigmoid, g, beta, A_log = None, dt_bias = None)."""
    _check(opts, q, v, g, beta, A_log, dt_bias)
    if opts.use_gate_in_kernel:
        HV, K = v.shape[2], q.shape[3]
        kda = opts.variant == KDA
        # A_log's and dt_bias's broadcast against g [B, T, HV(, K)]
        per_head, per_channel = ((HV, 1), (HV, K)) if kda else ((HV,), (HV,))
        g = _Gate.apply(g, A_log, dt_bias, opts.lower_bound, per_head, per_channel)
    if opts.use_beta_sigmoid:
        beta = _BetaSigmoid.apply(beta, 2.0 if opts.allow_neg_eigval else 1.0)
    return kernel_options(opts), g, beta, None, None


def kernel_options(opts: DeltaOptions) -> DeltaOptions:
    """The options the kernels get once the gate and the sigmoid are computed here."""
    return dataclasses.replace(opts, use_gate_in_kernel=False, lower_bound=None,
                               use_beta_sigmoid=False, allow_neg_eigval=False)
