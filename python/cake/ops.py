"""GDN and KDA as torch ops, wired to cake's C ABI (cake.abi).

Two custom ops carry all the work: ``cake::forward`` and ``cake::backward``; autograd connects them
(register_autograd). No maths here: shapes, allocation and wiring only. CPU tensors run the FP64
reference in C++ (outputs in the input dtype); CUDA tensors run the kernels where they exist.

Saved, inverse and recompute modes (docs/design/gdn-hopper.md): in saved mode ``cake::forward``
also returns the saved set, a uint8 blob of the C query's size (empty on the CPU, whose reference
always recomputes), which autograd keeps for ``cake::backward``; in inverse mode the blob holds
(GDN) all but the states per chunk (the chunk inverses, the gate cumsum, beta and, with the q/k L2
norm, the normalised q, k and their rows' rstd) or (KDA) what ``kkt_solve`` writes but the walks'
operands (the chunk inverses, P, beta and G's last rows); the backward recomputes the rest; in
recompute mode the blob is empty and the backward recomputes the forward's stages. Where GDN's
blob holds the normalised q and k, the backward reads no element of q or k (include/cake/cake.h),
so autograd keeps neither: one-element stand-ins of their shape go to ``cake::backward`` (KDA
keeps them).
"""

import warnings
from typing import Optional

import torch
from torch import Tensor

from . import abi, intermediate
from .options import GDN, KDA  # noqa: F401 (for callers)
from .options import RECOMPUTE_ORDERED, SAVE_MODES, DeltaOptions

_default_save_for_backward = "inverse"


def set_default_save_for_backward(mode: str) -> str:
    """Sets the mode that ``save_for_backward=None`` means; returns the previous default.

    "saved": the forward keeps what the backward needs, so the backward skips recomputing the
    forward's stages (the saved set is held from forward to backward, about 0.8 KB per token and
    value head on CUDA). "inverse" (the initial default): the forward keeps the chunk inverses
    (about 0.14 KB per token and value head) and, with the q/k L2 norm, the normalised q, k and
    their rstd in place of q and k (what flash-linear-attention keeps); the backward recomputes
    the rest. "recompute": nothing is kept; the backward recomputes all (the least
    activation memory). Results are bitwise identical in every mode.
    """
    global _default_save_for_backward
    previous, _default_save_for_backward = _default_save_for_backward, _save_mode(mode)
    return previous


def _save_mode(mode: Optional[str]) -> str:
    """mode, or the module default for None; a clear ValueError for anything else."""
    if mode is None:
        return _default_save_for_backward
    if not isinstance(mode, str) or mode not in SAVE_MODES:
        raise ValueError(f"save_for_backward must be 'saved', 'inverse' or 'recompute' (None: the "
                         f"default, now {_default_save_for_backward!r}), got {mode!r}")
    return mode


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _state_dtype(q: Tensor) -> torch.dtype:
    # Recurrent states are float32, as in flash-linear-attention; float64 inputs keep float64 so
    # that torch.autograd.gradcheck can run on the CPU reference.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _num_seqs(q: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return cu_seqlens.numel() - 1 if cu_seqlens is not None else q.shape[0]


def _outputs_like(q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], output_final_state: bool):
    """o [B, T, HV, V] and final_state [N, HV, K, V] (an empty tensor when not wanted).

    When q or v has the wrong rank, o is None and the C++ validation reports the input's error.
    """
    empty = q.new_empty(0, dtype=_state_dtype(q))
    if q.dim() != 4 or v.dim() != 4:
        return None, empty
    o = q.new_empty(q.shape[:2] + v.shape[2:])
    if not output_final_state:
        return o, empty
    n = _num_seqs(q, cu_seqlens)
    final_state = q.new_empty((max(n, 0), v.shape[2], q.shape[3], v.shape[3]), dtype=_state_dtype(q))
    return o, final_state


def _workspace(nbytes: int, like: Tensor) -> Optional[Tensor]:
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device) if nbytes else None


def _saved_blob(nbytes: int, like: Tensor) -> Tensor:
    """The saved set's buffer: uint8 [nbytes] on like's device (torch's allocations are 512-byte
    aligned, as the C ABI's 256-byte rule for the saved set asks)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device)


@torch.library.custom_op("cake::forward", mutates_args=())
def _forward(
    variant: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], A_log: Optional[Tensor],
    dt_bias: Optional[Tensor], scale: float, output_final_state: bool, use_qk_l2norm: bool,
    use_gate_in_kernel: bool, lower_bound: Optional[float], use_beta_sigmoid: bool,
    allow_neg_eigval: bool, save_for_backward: int, unordered_sums: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """o, final_state (empty when not wanted) and the saved set (empty in recompute mode, 0).

    save_for_backward: the mode's options.save_for_backward (SAVE_MODES); unordered_sums:
    options.unordered_sums (not deterministic; the backward's).
    """
    o, final_state = _outputs_like(q, v, cu_seqlens, output_final_state)
    inputs = (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias)
    outputs = (o, final_state if output_final_state else None)
    options = (variant, scale, use_qk_l2norm, use_gate_in_kernel, lower_bound, use_beta_sigmoid,
               allow_neg_eigval, save_for_backward, unordered_sums)
    saved = _saved_blob(abi.forward_saved_size(*inputs, *outputs, *options)
                        if save_for_backward else 0, q)
    workspace = _workspace(abi.forward_workspace_size(*inputs, *outputs, *options), q)
    abi.forward(*inputs, *outputs, *options, saved if save_for_backward else None, workspace,
               _stream(q))
    return o, final_state, saved


def _saves(device: torch.device) -> bool:
    """Whether a forward on device keeps a saved set: only the CUDA paths do (the CPU reference
    recomputes)."""
    return device.type == "cuda"


def _saved_bytes_of_shapes(variant: int, q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor],
                           use_qk_l2norm: bool, save_for_backward: int):
    """What abi.forward_saved_size returns for a valid call, from shapes and devices alone: an
    int for concrete shapes; where torch.compile traces symbolic ones, a new unbacked size, so
    that the graph does not specialise on T, B or N (nothing in it reads the saved set's size:
    the backward takes the set whole)."""
    if not save_for_backward or not _saves(q.device):
        return 0
    if q.dim() != 4 or v.dim() != 4:
        return 0  # the real call raises the C++ validation's error
    sizes = [*q.shape, *v.shape, *(() if cu_seqlens is None else (cu_seqlens.numel(),))]
    if not all(isinstance(n, int) for n in sizes):
        return torch.library.get_ctx().new_dynamic_size()
    return abi.cuda_saved_size_of_shapes(
        variant, list(q.shape), list(v.shape),
        None if cu_seqlens is None else cu_seqlens.numel(), use_qk_l2norm, save_for_backward)


@_forward.register_fake
def _forward_fake(variant, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                  output_final_state, use_qk_l2norm, use_gate_in_kernel, lower_bound,
                  use_beta_sigmoid, allow_neg_eigval, save_for_backward, unordered_sums):
    o, final_state = _outputs_like(q, v, cu_seqlens, output_final_state)
    nbytes = _saved_bytes_of_shapes(variant, q, v, cu_seqlens, use_qk_l2norm, save_for_backward)
    return o, final_state, _saved_blob(nbytes, q)


def _like(t: Optional[Tensor]) -> Optional[Tensor]:
    return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else None


@torch.library.custom_op("cake::backward", mutates_args=())
def _backward(
    variant: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], A_log: Optional[Tensor],
    dt_bias: Optional[Tensor], dout: Tensor, dht: Optional[Tensor], scale: float,
    use_qk_l2norm: bool, use_gate_in_kernel: bool, lower_bound: Optional[float],
    use_beta_sigmoid: bool, allow_neg_eigval: bool, save_for_backward: int, unordered_sums: bool,
    saved: Optional[Tensor],
) -> list[Tensor]:
    """dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias; an empty tensor stands for an absent input.

    save_for_backward: the forward's mode (SAVE_MODES); saved: the forward's saved set, or None in
    recompute mode.
    """
    inputs = (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias)
    grads = [_like(t) for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)]
    options = (variant, scale, use_qk_l2norm, use_gate_in_kernel, lower_bound, use_beta_sigmoid,
               allow_neg_eigval, save_for_backward, unordered_sums)
    nbytes = abi.backward_workspace_size(*inputs, dout, dht, *grads, *options)
    abi.backward(*inputs, dout, dht, *grads, *options, saved, _workspace(nbytes, q), _stream(q))
    return [t if t is not None else q.new_empty(0) for t in grads]


@_backward.register_fake
def _backward_fake(variant, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, dout,
                   dht, scale, use_qk_l2norm, use_gate_in_kernel, lower_bound, use_beta_sigmoid,
                   allow_neg_eigval, save_for_backward, unordered_sums, saved):
    return [_like(t) if t is not None else q.new_empty(0)
            for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)]


_OPTION_NAMES = ("scale", "output_final_state", "use_qk_l2norm", "use_gate_in_kernel",
                 "lower_bound", "use_beta_sigmoid", "allow_neg_eigval", "save_for_backward",
                 "unordered_sums")


def _setup_context(ctx, inputs, output):
    variant, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, *options = inputs
    # Outputs the loss does not use get None, not zeros: with torch's default every backward would
    # allocate and zero a tensor of the saved set's size for the blob's gradient (uint8, unused;
    # 1.6 GB at workload A in inverse mode, 8 GB in saved mode) and a zero final-state gradient.
    ctx.set_materialize_grads(False)
    saved = output[2]  # the saved set; empty in recompute mode (and always on the CPU)
    ctx.variant = variant
    ctx.options = dict(zip(_OPTION_NAMES, options))
    # GDN's saved set with the L2 norm holds q̂, k̂ and their rstd (saved and inverse modes, on
    # CUDA): the backward reads no element of q or k then, so they are not kept, only their shape.
    # KDA keeps q and k (its CUDA backward checks them in every mode).
    ctx.qk_standin = None
    if variant == GDN and ctx.options["use_qk_l2norm"] and saved.numel() > 0:
        ctx.qk_standin = ((q.shape, q.dtype), (k.shape, k.dtype), q.device)
        q = k = None
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, saved)


def _backward_rule(ctx, dout, dfinal_state, dsaved):
    q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, saved = ctx.saved_tensors
    if ctx.qk_standin is not None:  # one element each, expanded to the shape (stride 0)
        (q_shape, q_dtype), (k_shape, k_dtype), device = ctx.qk_standin
        q = torch.empty(1, dtype=q_dtype, device=device).expand(q_shape)
        k = torch.empty(1, dtype=k_dtype, device=device).expand(k_shape)
    opts = ctx.options
    dht = dfinal_state if opts["output_final_state"] and dfinal_state is not None else None
    if dout is None:
        dout = torch.zeros(q.shape[:2] + v.shape[2:], dtype=q.dtype, device=q.device)
    dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias = _backward(
        ctx.variant, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias,
        dout.contiguous(), None if dht is None else dht.contiguous(), opts["scale"],
        opts["use_qk_l2norm"], opts["use_gate_in_kernel"], opts["lower_bound"],
        opts["use_beta_sigmoid"], opts["allow_neg_eigval"], opts["save_for_backward"],
        opts["unordered_sums"], saved if opts["save_for_backward"] else None)
    absent = lambda t, grad: grad if t is not None else None  # noqa: E731
    return (None, dq, dk, dv, dg, dbeta, absent(initial_state, dh0), None,
            absent(A_log, dA_log), absent(dt_bias, ddt_bias), *([None] * len(_OPTION_NAMES)))


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def first_order_only(ctx, *grads):
    """The autograd of cake's backward ops: differentiating a gradient says clearly that it is
    not supported (else torch's message would ask for an autograd formula)."""
    raise RuntimeError("cake's ops give first-order gradients only: differentiating their "
                       "gradients (double backward, e.g. a gradient penalty) is not supported")


_backward.register_autograd(first_order_only)


def default_scale(q: Tensor) -> float:
    """K^-1/2; an invalid q gets a placeholder so that the C++ validation names q's problem."""
    return q.shape[-1] ** -0.5 if q.dim() == 4 and q.shape[-1] > 0 else 1.0


def _check_state_v_first(initial_state: Tensor, q: Tensor, v: Tensor,
                         cu_seqlens: Optional[Tensor]) -> None:
    """The shape check of initial_state in the layout the caller passes, [N, HV, V, K]."""
    if q.dim() != 4 or v.dim() != 4:
        return  # the C++ validation reports q's or v's rank first
    expected = (_num_seqs(q, cu_seqlens), v.shape[2], v.shape[3], q.shape[3])
    if tuple(initial_state.shape) != expected:
        raise ValueError(f"initial_state must have shape [N, HV, V, K] = {list(expected)} with "
                         f"state_v_first=True, got {list(initial_state.shape)}")


def head_counts(q, v) -> dict:
    """num_v_heads and head_dim_k for options.parse (None where q or v have the wrong rank)."""
    ok = isinstance(q, Tensor) and isinstance(v, Tensor) and q.dim() == 4 and v.dim() == 4
    return dict(num_v_heads=v.shape[2] if ok else None, head_dim_k=q.shape[3] if ok else None)


class CudaSupportWarning(UserWarning):
    """A call ran on the CPU reference that the CUDA kernels would refuse (a dtype, a head dim):
    the same call on CUDA tensors raises ValueError. float64 calls (gradcheck) do not warn."""


def warn_if_cuda_refuses(op_name: str, error, stacklevel: int) -> None:
    """A CPU call's support query for CUDA (abi.*support_error): where it is a ValueError (CUDA
    tensors would be refused), a CudaSupportWarning naming op_name, at stacklevel as
    warnings.warn counts it from here."""
    if isinstance(error, ValueError):
        warnings.warn(f"{op_name} ran on the CPU reference, but CUDA tensors would be "
                      f"refused: {error} (cake.build_info() says what CUDA accepts)",
                      CudaSupportWarning, stacklevel=stacklevel)


def check_call(opts: DeltaOptions, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
               initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
               A_log: Optional[Tensor], dt_bias: Optional[Tensor]) -> None:
    """What the public ops check in Python before any path runs (raises ValueError): the save
    mode and every tensor on q's device. C++ checks devices too, but a meta tensor among real
    ones would never reach it: the dispatcher would route the call to the shape-only fake
    implementation."""
    _save_mode(opts.save_for_backward)
    tensors = dict(k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   A_log=A_log, dt_bias=dt_bias)
    for name, t in tensors.items():
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")


def run(opts: DeltaOptions, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
        initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], A_log: Optional[Tensor],
        dt_bias: Optional[Tensor]):
    """Shared body of chunk_gated_delta_rule and chunk_kda (options parsed and valid, arguments
    checked by check_call): returns (o, final_state or None), and the intermediate states with
    return_intermediate_states."""
    mode = _save_mode(opts.save_for_backward)
    scale = float(default_scale(q) if opts.scale is None else opts.scale)
    if opts.state_v_first and initial_state is not None:
        _check_state_v_first(initial_state, q, v, cu_seqlens)
        initial_state = initial_state.transpose(-1, -2)  # [N, HV, V, K] -> [N, HV, K, V]
    # As flash-linear-attention does, any strides in: the kernels read dense rows, so views (a
    # slice of a fused projection, a transposed state) are copied once here, with autograd.
    q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens = (
        t.contiguous() if isinstance(t, Tensor) else t
        for t in (q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens))
    # Saving pays only when a backward will run: not under no_grad, nor without a grad input.
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state, A_log, dt_bias))
    inputs = (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias)
    o, final_state, _ = _forward(opts.variant, *inputs, scale, opts.output_final_state,
                                 *opts.flags(), SAVE_MODES[mode] if needs_grad else 0,
                                 opts.unordered_sums)
    # The warning asks the C++ support checks, which torch.compile cannot trace: compiled calls
    # skip it (their eager runs warn).
    if (q.device.type == "cpu" and any(t.dtype != torch.float64 for t in (q, g, beta))
            and not torch.compiler.is_compiling()):
        outputs = (o, final_state if opts.output_final_state else None)
        warn_if_cuda_refuses(opts.op.name,
                             abi.support_error(*inputs, *outputs, opts.variant, scale,
                                               *opts.flags(), *RECOMPUTE_ORDERED,
                                               device_type=abi.CUDA),
                             stacklevel=5)
    if not opts.output_final_state:
        final_state = None
    elif opts.state_v_first:
        final_state = final_state.transpose(-1, -2).contiguous()
    if not opts.return_intermediate_states:
        return o, final_state
    h = intermediate.states(opts, inputs, scale, _forward)
    return o, final_state, h.transpose(-1, -2).contiguous() if opts.state_v_first else h
