"""The gated RMSNorm of the layers' outputs, as flash-linear-attention's ``FusedRMSNormGated``
(and, without a gate, ``RMSNorm``) compute it.

Two custom ops carry the work, ``cake::rms_norm_gated_forward`` and
``cake::rms_norm_gated_backward`` over the C ABI (cakeRmsNormForward / cakeRmsNormBackward);
autograd connects them and saves x, g, weight and the forward's rstd (one float a row). CPU tensors
run the FP64 reference (outputs in the inputs' dtypes); CUDA tensors run the kernels.

Per row of N values (x's last dimension):
    rstd = 1 / sqrt(mean(x^2) + eps),   y = x * rstd * weight * act(g)
with act swish (= silu, g * sigmoid(g)) or sigmoid; weight and g optional.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from . import abi
from .conv1d import _stream, _workspace
from .ops import first_order_only, warn_if_cuda_refuses

# cakeActivation_t of the gate activations flash-linear-attention accepts.
ACTIVATIONS = {"swish": 1, "silu": 1, "sigmoid": 2}
MAX_DIMS = 5  # CAKE_MAX_DIMS


def _outputs_like(x: Tensor) -> tuple[Tensor, Tensor]:
    """y in x's shape and dtype; rstd [rows] in float32 (float64 for float64 x, which the CPU
    reference keeps exact)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return y, x.new_empty(math.prod(x.shape[:-1]), dtype=rstd_dtype)


def _aligned(t: Optional[Tensor]) -> Optional[Tensor]:
    """t, or on CUDA a copy of it where its base is not 16-byte aligned (a view into a buffer at
    an odd offset): the kernels load rows as 16-byte vectors. Called inside the custom ops, whose
    tensors are always real ones (torch.compile traces the ops' fake kernels instead, and a fake
    tensor has no address)."""
    if t is not None and t.is_cuda and t.data_ptr() % 16:
        return t.clone()
    return t


@torch.library.custom_op("cake::rms_norm_gated_forward", mutates_args=())
def _forward(x: Tensor, g: Optional[Tensor], weight: Optional[Tensor], eps: float,
             activation: int) -> tuple[Tensor, Tensor]:
    """y and rstd."""
    x, g, weight = _aligned(x), _aligned(g), _aligned(weight)
    y, rstd = _outputs_like(x)
    abi.norm_forward(x, g, weight, y, rstd, eps, activation, _stream(x))
    return y, rstd


@_forward.register_fake
def _forward_fake(x, g, weight, eps, activation):
    return _outputs_like(x)


def _like(t: Optional[Tensor], fallback: Tensor) -> Tensor:
    if t is None:
        return fallback.new_empty(0)
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("cake::rms_norm_gated_backward", mutates_args=())
def _backward(x: Tensor, g: Optional[Tensor], weight: Optional[Tensor], rstd: Tensor, dy: Tensor,
              activation: int) -> list[Tensor]:
    """dx, dg, dweight; an empty tensor stands for an absent input's."""
    x, g, weight, dy = _aligned(x), _aligned(g), _aligned(weight), _aligned(dy)
    dx, dg, dweight = _like(x, x), _like(g, x), _like(weight, x)
    args = (x, g, weight, rstd, dy, dx, dg if g is not None else None,
            dweight if weight is not None else None, activation)
    workspace = _workspace(abi.norm_backward_workspace_size(*args), x)
    abi.norm_backward(*args, workspace, _stream(x))
    return [dx, dg, dweight]


@_backward.register_fake
def _backward_fake(x, g, weight, rstd, dy, activation):
    return [_like(x, x), _like(g, x), _like(weight, x)]


def _setup_context(ctx, inputs, output):
    x, g, weight, _, activation = inputs
    ctx.set_materialize_grads(False)  # rstd's gradient: None, not a tensor of zeros per call
    ctx.save_for_backward(x, g, weight, output[1])
    ctx.activation = activation


def _backward_rule(ctx, dy, drstd):
    x, g, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dx, dg, dweight = _backward(x, g, weight, rstd, dy, ctx.activation)
    return (dx, dg if g is not None else None, dweight if weight is not None else None, None,
            None)


_forward.register_autograd(_backward_rule, setup_context=_setup_context)
_backward.register_autograd(first_order_only)


def rms_norm_gated(x: Tensor, g: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                   eps: float = 1e-5, activation: str = "swish") -> Tensor:
    """RMSNorm over the last dimension, times act(g): ``x / sqrt(mean(x^2) + eps) * weight *
    act(g)``, as flash-linear-attention's ``FusedRMSNormGated`` (``RMSNorm`` with g None).

    Args:
        x: ``[..., N]``.
        g: x's shape, or None (no gate); cast to x's dtype where it differs (FLA's kernel reads g
            in its own dtype; under autocast, as the layers run, both are bfloat16 anyway).
        weight: ``[N]``, or None (ones).
        eps: added to the mean square, finite and >= 0 (float32 on CUDA; 0 with an all-zero
            row gives NaN, as FLA's norm does).
        activation: of the gate: ``"swish"`` (= ``"silu"``) or ``"sigmoid"``.

    Returns:
        y in x's shape and dtype, computed in float32 on CUDA (float64 on the CPU).
        Differentiable for x, g and weight; weight's gradient is bitwise reproducible.

    On CUDA tensors (the sm_90a kernels): bfloat16, float16 or float32 x, weight bfloat16,
    float16 or float32, N a multiple of 8 and at most 1024. CPU tensors run the FP64 reference
    (any float dtype, any N), warning with ``cake.CudaSupportWarning`` where CUDA would refuse
    the call (float64 calls do not warn).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    for name, t in (("g", g), ("weight", weight)):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        # A meta tensor among real ones would never reach the C++ device check: the dispatcher
        # would route the call to the fake implementation.
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device ({x.device}), got {t.device}")
    if g is not None and g.dtype != x.dtype:
        g = g.to(x.dtype)
    shape = x.shape
    if x.dim() > MAX_DIMS:
        x = x.reshape(-1, shape[-1])
        if g is not None and g.shape == shape:
            g = g.reshape(x.shape)
    x, g, weight = (None if t is None else t.contiguous() for t in (x, g, weight))
    code = ACTIVATIONS[activation]
    y, rstd = _forward(x, g, weight, float(eps), code)
    # not while torch.compile traces: the query is a C++ call, a graph break
    if (x.device.type == "cpu" and x.dtype != torch.float64
            and not torch.compiler.is_compiling()):
        warn_if_cuda_refuses(
            "rms_norm_gated",
            abi.norm_support_error(x, g, weight, y, rstd, float(eps), code, device_type=abi.CUDA),
            stacklevel=3)
    return y.view(shape)
