"""The public functions, with flash-linear-attention's argument names, layouts and returns."""

from typing import Optional

from torch import Tensor

from . import ops, segments
from .options import CHUNK_SIZE, GATED_DELTA_RULE, KDA_OP, Op, parse

_CUDA_LIMITS = """
    On CUDA tensors (the sm_90a kernels): bfloat16 q, k, v (o in bfloat16), float32 g, float32
    or bfloat16 beta, float32 initial_state; K = V = 128; with use_gate_in_kernel g, A_log and
    dt_bias may be float32, bfloat16 or float16, and so may beta with
    use_beta_sigmoid_in_kernel (both computed by a kernel of the op in float32). On CPU tensors the FP64 reference takes any float dtype and head dims 1..256 (it
    warns, with ``cake.CudaSupportWarning``, when CUDA would refuse a call; float64 inputs, as
    gradcheck uses, do not warn). ``cake.build_info()`` says what this build supports where."""


def _no_cp_context(cp_context) -> None:
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context is flash-linear-attention's context parallelism; use cake.kcp instead")


def _call(op: Op, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, A_log, dt_bias,
          options: dict):
    """The body of both ops: the options parsed once, then the plain op, or its documents walked
    as exact segments where the call gives its offsets on the host and the plan predicts a gain
    (cake.segments)."""
    opts, A_log_flat, dt_bias_flat, errors = parse(op, A_log=A_log, dt_bias=dt_bias,
                                                   **ops.head_counts(q, v), stacklevel=4,
                                                   **options)
    if errors:
        raise ValueError(errors[0])
    ops.check_call(opts, q, k, v, g, beta, initial_state, cu_seqlens, A_log_flat, dt_bias_flat)
    ctx = segments.context_for(opts, q, v, cu_seqlens, cu_seqlens_cpu, initial_state)
    if ctx is not None:  # the options as parsed (no second deprecation warning)
        resolved = dict(options, state_v_first=opts.state_v_first, transpose_state_layout=None)
        try:
            return segments.run(op, ctx, q, k, v, g, beta, initial_state, A_log, dt_bias,
                                resolved)
        except ValueError:
            pass  # refused before any work: the plain op runs, or names the argument as always
    return ops.run(opts, q, k, v, g, beta, initial_state, cu_seqlens, A_log_flat, dt_bias_flat)


def chunk_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    chunk_size: int = CHUNK_SIZE,
    transpose_state_layout: Optional[bool] = None,
    head_first: Optional[bool] = None,
    save_for_backward: Optional[str] = None,
    deterministic: bool = True,
):
    """Gated DeltaNet: S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,
    o_t = scale S_t^T q_t, per document and value head.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, HV a multiple of H (value head hv reads
            q/k head ``hv // (HV // H)``). g: ``[B, T, HV]`` natural-log decay per token (or the
            raw gate with ``use_gate_in_kernel=True``). beta: ``[B, T, HV]``.
        scale: defaults to ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``), N = B or the
            number of documents of ``cu_seqlens``.
        output_final_state: also return the state after each document's last token.
        use_qk_l2norm_in_kernel: ``x / sqrt(sum x^2 + 1e-6)`` on q and k per token and head
            inside the op, with its backward.
        use_beta_sigmoid_in_kernel: beta is raw; the op applies ``c * sigmoid(beta)``, with
            ``c = 2`` under ``allow_neg_eigval`` (which needs it).
        state_v_first: states in ``[N, HV, V, K]`` (``transpose_state_layout`` is its deprecated
            name, with a DeprecationWarning).
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of packed documents; requires ``B = 1``.
        cu_seqlens_cpu: the host copy of ``cu_seqlens`` (int tensor on the CPU, the same
            values). With it, a CUDA call whose documents are few and long for the GPU walks them
            as exact segments in parallel where the segment plan predicts a gain (results within
            the accuracy gate of the plain op's, deterministic; ``cake.segments``); without it
            cake plans nothing, so that it reads nothing back from the device.
        chunk_indices: accepted for compatibility; cake derives its schedule from
            ``cu_seqlens``.
        cp_context: flash-linear-attention's context parallelism; cake's is ``cake.kcp``.
        use_gate_in_kernel: g is raw; the op computes ``g <- -exp(A_log) * softplus(g +
            dt_bias)`` with ``A_log`` of HV elements and optional ``dt_bias`` of HV elements (any
            shape, e.g. ``[HV]``). Without it A_log and dt_bias are ignored.
        chunk_size: 16, 32 or 64 accepted; cake computes at 64, which gives the same result.
        head_first: removed (an error when given), as in flash-linear-attention.
        save_for_backward: what the CUDA forward keeps for the backward. ``"inverse"`` (the
            default of ``cake.set_default_save_for_backward``): the chunk inverses, the gate
            cumsum and beta, about 0.14 KB per token and value head, and with
            ``use_qk_l2norm_in_kernel`` the normalised q/k and their rstd in place of q and k
            (what flash-linear-attention keeps); the backward recomputes the rest. ``"saved"``:
            also the normalised q/k and the chunk states, about 0.8 KB per token and value head,
            so the backward recomputes nothing. ``"recompute"``: nothing, for the least
            activation memory. Bitwise identical results; nothing is saved without a gradient or
            on the CPU (the reference recomputes). Inside ``torch.utils.checkpoint`` the saved
            set is dropped and rebuilt with the other saved tensors.
        deterministic: ``True`` (the default): every gradient is bitwise the same run to run.
            ``False`` lets the CUDA backward sum dq and dk over the value heads of each q/k head
            (with ``HV > H``) by atomic adds in any order, a few per cent faster; results within
            the same accuracy, not bitwise reproducible. No effect elsewhere (the CPU reference,
            ``H == HV``, ``cu_seqlens_cpu``'s segmented walks and ``cake.kcp`` always sum in a
            fixed order).
    {cuda}

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 (float64 for float64
        inputs) or None)``.

    Example::

        o, ht = cake.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    """
    _no_cp_context(cp_context)
    options = dict(scale=scale, output_final_state=output_final_state,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   use_gate_in_kernel=use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                   allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                   transpose_state_layout=transpose_state_layout, chunk_size=chunk_size,
                   head_first=head_first, save_for_backward=save_for_backward,
                   deterministic=deterministic)
    return _call(GATED_DELTA_RULE, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu,
                 A_log, dt_bias, options)


def chunk_kda(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    *,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    chunk_size: int = CHUNK_SIZE,
    transpose_state_layout: Optional[bool] = None,
    head_first: Optional[bool] = None,
    save_for_backward: Optional[str] = None,
    deterministic: bool = True,
):
    """Kimi Delta Attention: as chunk_gated_delta_rule with a decay per key channel,
    S_t = Diag(exp(g_t)) S_{t-1} + k_t (beta_t (v_t - (Diag(exp(g_t)) S_{t-1})^T k_t))^T.

    Args (beyond chunk_gated_delta_rule's):
        g: ``[B, T, HV, K]``.
        use_gate_in_kernel: g is raw; ``g <- -exp(A_log) * softplus(g + dt_bias)`` with
            ``A_log`` of HV elements and optional ``dt_bias`` of HV * K elements (any shapes, e.g.
            ``[HV]`` and ``[HV * K]``), or, when ``lower_bound`` is set,
            ``g <- lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (A_log optional).
        safe_gate: a promise that ``g >= lower_bound >= -5`` (checked when the gate is computed
            in the op).
        lower_bound: the lower-bound gate above (with ``use_gate_in_kernel``; ignored without).
        disable_recompute: accepted; what the forward keeps for the backward is
            ``save_for_backward``'s mode.
        save_for_backward: as for chunk_gated_delta_rule; on CUDA ``"inverse"`` keeps the chunk
            pass's products (A, P, beta and G's last rows, about 0.26 KB per token and value
            head: the backward forms only the walks' operands again), ``"saved"`` the whole saved
            set (about 1.5 KB per token and value head with the chunk states).
        return_intermediate_states: under ``torch.inference_mode()`` only, also return the state
            before every chunk of ``chunk_size`` tokens: ``h [B, NT, HV, K, V]`` (``[B, NT, HV,
            V, K]`` with ``state_v_first``) in k's dtype, NT = ceil(T / chunk_size) per batch row,
            or with ``cu_seqlens`` B = 1 and NT the chunks of all documents in order.
        chunk_size: 32 or 64 accepted; cake computes at 64, which gives the same result (the
            intermediate states are taken every ``chunk_size`` tokens).
        use_graph, max_num_seqs: FLA's preparation for CUDA-graph capture, accepted: cake's call
            needs none (its sizes follow from the shapes and it reads the offsets on the device,
            so a captured call replays with new ``cu_seqlens`` contents of the same shape, empty
            tail documents as padding). With ``use_graph``, a given ``max_num_seqs`` must be the
            number of documents in ``cu_seqlens``, as FLA requires.
        deterministic: accepted; KDA's gradients are always bitwise reproducible.
    {cuda} On CUDA, g is ``[B, T, HV, K]``: float32, or a raw float32, bfloat16 or float16 gate
    with ``use_gate_in_kernel``.

    Returns:
        ``(o, final_state or None)``, or ``(o, final_state or None, h)`` with
        ``return_intermediate_states``.
    """
    _no_cp_context(cp_context)
    if use_graph and max_num_seqs is not None and isinstance(cu_seqlens, Tensor) \
            and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] - 1 != max_num_seqs:
        raise ValueError(f"max_num_seqs must be the number of documents in cu_seqlens (pad it "
                         f"with empty documents to max_num_seqs + 1 entries), got "
                         f"{cu_seqlens.shape[0] - 1} documents and max_num_seqs = {max_num_seqs}")
    options = dict(scale=scale, output_final_state=output_final_state,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   use_gate_in_kernel=use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                   allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate,
                   lower_bound=lower_bound, disable_recompute=disable_recompute,
                   return_intermediate_states=return_intermediate_states,
                   state_v_first=state_v_first, transpose_state_layout=transpose_state_layout,
                   chunk_size=chunk_size, head_first=head_first,
                   save_for_backward=save_for_backward, deterministic=deterministic)
    return _call(KDA_OP, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, A_log,
                 dt_bias, options)


chunk_gated_delta_rule.__doc__ = chunk_gated_delta_rule.__doc__.replace("{cuda}", _CUDA_LIMITS)
chunk_kda.__doc__ = chunk_kda.__doc__.replace("{cuda}", _CUDA_LIMITS)

# flash-linear-attention's alias.
chunk_gdn = chunk_gated_delta_rule
