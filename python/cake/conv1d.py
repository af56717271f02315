"""The causal depthwise conv1d before the delta rule, as flash-linear-attention's causal_conv1d.

Two custom ops carry the work, ``cake::conv1d_forward`` and ``cake::conv1d_backward`` over the C
ABI (cakeConv1dForward / cakeConv1dBackward); autograd connects them. CPU tensors run the FP64
reference (outputs in the inputs' dtypes); CUDA tensors run the kernels.

Per document of L tokens and channel d, on the extended sequence e[j] = x[j] (j >= 0) and
initial_state[n, d, W + j] (-W <= j < 0; zero without one):
    y[t] = act(sum_i weight[d, i] e[t - (W - 1) + i] + bias[d]) + residual[t]
    final_state[n, d, s] = e[L - W + s]
"""

import math
from typing import Optional

import torch
from torch import Tensor

from . import abi
from .ops import first_order_only, warn_if_cuda_refuses

# cakeActivation_t of the names flash-linear-attention accepts.
ACTIVATIONS = {None: 0, "silu": 1, "swish": 1}


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _workspace(nbytes: int, like: Tensor) -> Optional[Tensor]:
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device) if nbytes else None


def _num_seqs(x: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return cu_seqlens.numel() - 1 if cu_seqlens is not None else x.shape[0]


def _outputs_like(x: Tensor, weight: Tensor, cu_seqlens: Optional[Tensor],
                  output_final_state: bool):
    """y [B, T, D] and final_state [N, D, W] in x's dtype (empty when not wanted). With a weight
    of the wrong rank the state is empty and the C++ validation names weight's problem."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if not output_final_state or weight.dim() != 2:
        return y, x.new_empty(0)
    n = max(_num_seqs(x, cu_seqlens), 0)
    return y, x.new_empty((n, weight.shape[0], weight.shape[1]))


@torch.library.custom_op("cake::conv1d_forward", mutates_args=())
def _forward(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
             initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], activation: int,
             output_final_state: bool) -> tuple[Tensor, Tensor]:
    """y and final_state (empty when not wanted)."""
    y, final_state = _outputs_like(x, weight, cu_seqlens, output_final_state)
    args = (x, weight, bias, residual, initial_state, cu_seqlens, y,
            final_state if output_final_state else None, activation)
    workspace = _workspace(abi.conv1d_forward_workspace_size(*args), x)
    abi.conv1d_forward(*args, workspace, _stream(x))
    return y, final_state


@_forward.register_fake
def _forward_fake(x, weight, bias, residual, initial_state, cu_seqlens, activation,
                  output_final_state):
    return _outputs_like(x, weight, cu_seqlens, output_final_state)


def _like(t: Optional[Tensor], fallback: Tensor) -> Tensor:
    if t is None:
        return fallback.new_empty(0)
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("cake::conv1d_backward", mutates_args=())
def _backward(x: Tensor, weight: Tensor, bias: Optional[Tensor], initial_state: Optional[Tensor],
              cu_seqlens: Optional[Tensor], dy: Tensor, dht: Optional[Tensor],
              activation: int) -> list[Tensor]:
    """dx, dweight, dbias, dinitial_state; an empty tensor stands for an absent input's."""
    dx, dweight = _like(x, x), _like(weight, x)
    dbias, dh0 = _like(bias, x), _like(initial_state, x)
    args = (x, weight, bias, initial_state, cu_seqlens, dy, dht, dx, dweight,
            dbias if bias is not None else None, dh0 if initial_state is not None else None,
            activation)
    workspace = _workspace(abi.conv1d_backward_workspace_size(*args), x)
    abi.conv1d_backward(*args, workspace, _stream(x))
    return [dx, dweight, dbias, dh0]


@_backward.register_fake
def _backward_fake(x, weight, bias, initial_state, cu_seqlens, dy, dht, activation):
    return [_like(x, x), _like(weight, x), _like(bias, x), _like(initial_state, x)]


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, initial_state, cu_seqlens, activation, output_final_state = inputs
    ctx.set_materialize_grads(False)  # an unused final state's gradient: None, not zeros
    ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens)
    ctx.activation = activation
    ctx.output_final_state = output_final_state
    ctx.has_residual = residual is not None


def _backward_rule(ctx, dy, dfinal_state):
    x, weight, bias, initial_state, cu_seqlens = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dht = dfinal_state if ctx.output_final_state and dfinal_state is not None else None
    dy = dy.contiguous()
    dx, dweight, dbias, dh0 = _backward(x, weight, bias, initial_state, cu_seqlens, dy,
                                        None if dht is None else dht.contiguous(),
                                        ctx.activation)
    return (dx, dweight, dbias if bias is not None else None,
            dy if ctx.has_residual else None, dh0 if initial_state is not None else None,
            None, None, None)


_forward.register_autograd(_backward_rule, setup_context=_setup_context)
_backward.register_autograd(first_order_only)


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    residual: Optional[Tensor] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    activation: Optional[str] = None,
    backend: Optional[str] = None,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
):
    """Causal depthwise conv1d per document, with an optional SiLU, as flash-linear-attention's
    ``causal_conv1d``: ``y[t] = act(sum_i weight[:, i] * x[t - (W - 1) + i] + bias) + residual[t]``
    (``weight[:, W - 1]`` multiplies the current token; tokens before a document's start are its
    initial state's, or zero).

    Args:
        x: ``[B, T, D]`` (or ``[B, T, ...]`` whose trailing sizes multiply to D, as FLA accepts).
        weight: ``[D, W]``. bias: ``[D]``. residual: x's shape, added after the activation.
        initial_state: ``[N, D, W]``: column ``W + j`` holds the token at ``j < 0`` before the
            document (column 0 is read only as the final state of an empty document).
        output_final_state: also return ``[N, D, W]``, each document's last W tokens (for a
            document shorter than W, the initial state's tail in front of them).
        activation: None, ``"silu"`` or ``"swish"`` (the same function).
        backend: FLA's choice of its own kernels ("triton", "cuda", "mix"), accepted; cake's
            run either way.
        cu_seqlens: ``[N + 1]`` int32/int64 packed documents (B = 1); else N = B.
        cu_seqlens_cpu, chunk_indices: FLA's hints, accepted and unused.
        cp_context: FLA's context parallelism: ``cake.kcp.causal_conv1d_kcp`` instead.

    Returns:
        ``(y, final_state or None)``: y in x's shape and dtype, final_state in x's dtype.
        Differentiable for x, weight, bias, residual and initial_state.

    On CUDA tensors (the sm_90a kernels): bfloat16, float16 or float32 x (residual in x's dtype),
    weight, bias and states float32, bfloat16 or float16, W = 2..4, any D. CPU tensors run the
    FP64 reference (any float dtype, any W), warning with ``cake.CudaSupportWarning`` where CUDA
    would refuse the call (float64 calls do not warn).
    """
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context is flash-linear-attention's context parallelism; use "
            "cake.kcp.causal_conv1d_kcp instead")
    if backend not in (None, "triton", "cuda", "mix"):
        raise ValueError(f"backend must be None, 'triton', 'cuda' or 'mix' (all run cake's "
                         f"kernels), got {backend!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    tensors = dict(weight=weight, bias=bias, residual=residual, initial_state=initial_state,
                   cu_seqlens=cu_seqlens)
    for name, t in tensors.items():
        # A meta tensor among real ones would never reach the C++ device check: the dispatcher
        # would route the call to the fake implementation.
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on x's device ({x.device}), got {t.device}")
    shape = x.shape
    if x.dim() > 3 and weight.dim() == 2 and math.prod(shape[2:]) == weight.shape[0]:
        x = x.flatten(2)
        if residual is not None and residual.shape == shape:
            residual = residual.flatten(2)
    x, weight, bias, residual, initial_state, cu_seqlens = (
        t.contiguous() if isinstance(t, Tensor) else t
        for t in (x, weight, bias, residual, initial_state, cu_seqlens))
    code = ACTIVATIONS[activation]
    y, final_state = _forward(x, weight, bias, residual, initial_state, cu_seqlens, code,
                              bool(output_final_state))
    # not while torch.compile traces: the query is a C++ call, a graph break
    if (x.device.type == "cpu" and x.dtype != torch.float64
            and not torch.compiler.is_compiling()):
        warn_if_cuda_refuses(
            "causal_conv1d",
            abi.conv1d_support_error(x, weight, bias, residual, initial_state, cu_seqlens, y,
                                     final_state if output_final_state else None, code,
                                     device_type=abi.CUDA),
            stacklevel=3)
    return y.view(shape), final_state if output_final_state else None
