"""The public functions, with flash-linear-attention's argument names, layouts and returns."""

from typing import Optional

from torch import Tensor

from . import ops

_CHUNK_SIZE = 64


def _check_common(kwargs: dict, chunk_sizes: tuple, cp_context) -> None:
    if "head_first" in kwargs:
        raise ValueError("head_first has been removed: inputs must be in [B, T, H, ...] format")
    chunk_size = kwargs.pop("chunk_size", _CHUNK_SIZE)
    if chunk_size not in chunk_sizes:
        raise ValueError(f"chunk_size must be one of {chunk_sizes}, got {chunk_size}")
    if chunk_size != _CHUNK_SIZE:
        raise ValueError(f"cake computes with chunk_size={_CHUNK_SIZE}, got {chunk_size}")
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context is flash-linear-attention's context parallelism; use cake.kcp instead")


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
    save_for_backward: Optional[str] = None,
    **kwargs,
):
    """Gated DeltaNet: S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,
    o_t = scale S_t^T q_t.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, HV a multiple of H (value head hv reads
            q/k head ``hv // (HV // H)``). g: ``[B, T, HV]`` natural-log decay per token (or the raw
            gate with ``use_gate_in_kernel=True``). beta: ``[B, T, HV]``.
        scale: defaults to ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``).
        output_final_state: also return the state after each document's last token.
        use_qk_l2norm_in_kernel: L2-normalise q and k per token and head inside the op.
        use_beta_sigmoid_in_kernel: beta is raw; the op applies ``c * sigmoid(beta)``, with
            ``c = 2`` under ``allow_neg_eigval``.
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of packed documents; requires ``B = 1``.
        cu_seqlens_cpu, chunk_indices: accepted for compatibility with flash-linear-attention;
            cake derives its schedule from ``cu_seqlens``.
        save_for_backward: ``"saved"``: the forward keeps what the backward reads (normalised
            q/k, the gate cumsum, the chunk inverses, beta and the chunk states: about 0.8 KB per
            token and value head on CUDA), so the backward skips recomputing the forward's
            stages. ``"inverse"``: the forward keeps the chunk inverses, the gate cumsum and beta
            (about 0.14 KB per token and value head, what flash-linear-attention keeps besides its
            inputs) and the backward recomputes the rest. ``"recompute"``: nothing is kept and the
            backward recomputes all, for the least activation memory. Results are bitwise
            identical. ``None``: the default of ``cake.set_default_save_for_backward`` (initially
            ``"inverse"``, so that the activation memory stays that of
            flash-linear-attention). Nothing is saved when
            no gradient is needed or on the CPU (the reference always recomputes). Inside
            ``torch.utils.checkpoint`` the saved set is dropped and rebuilt with the other saved
            tensors, so ``"saved"`` costs only the checkpointed layer's transient memory there.
        kwargs: ``use_gate_in_kernel`` with ``A_log [HV]`` and optional ``dt_bias [HV]``
            (``g <- -exp(A_log) * softplus(g + dt_bias)``); ``chunk_size`` (64).

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``.

    Example::

        o, ht = cake.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    """
    _check_common(kwargs, (16, 32, 64), cp_context)
    use_gate_in_kernel = kwargs.pop("use_gate_in_kernel", False)
    A_log = kwargs.pop("A_log", None)
    dt_bias = kwargs.pop("dt_bias", None)
    if kwargs:
        raise TypeError(f"chunk_gated_delta_rule got unexpected arguments {sorted(kwargs)}")
    return ops.run(
        ops.GDN, q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, A_log=A_log,
        dt_bias=dt_bias, use_qk_l2norm=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, lower_bound=None,
        use_beta_sigmoid=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, save_for_backward=save_for_backward)


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
    **kwargs,
):
    """Kimi Delta Attention: as chunk_gated_delta_rule with a decay per key channel,
    S_t = Diag(exp(g_t)) S_{t-1} + k_t (beta_t (v_t - (Diag(exp(g_t)) S_{t-1})^T k_t))^T.

    Args (beyond chunk_gated_delta_rule's):
        g: ``[B, T, HV, K]``.
        use_gate_in_kernel: g is raw; ``g <- -exp(A_log) * softplus(g + dt_bias)`` with
            ``A_log [HV]`` and optional ``dt_bias [HV * K]`` (kwargs), or, when ``lower_bound`` is
            set, ``g <- lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (A_log optional).
        safe_gate: a promise that ``g >= lower_bound >= -5`` (checked as in flash-linear-attention
            when the gate is computed in the op).
        disable_recompute: accepted; the backward's saved-state mode is
            ``cake.set_default_save_for_backward``'s (KDA has no CUDA kernels yet, and the CPU
            reference always recomputes).
        return_intermediate_states: not supported (inference only in flash-linear-attention).

    Returns:
        ``(o, final_state or None)``.
    """
    _check_common(kwargs, (32, 64), cp_context)
    A_log = kwargs.pop("A_log", None)
    dt_bias = kwargs.pop("dt_bias", None)
    if kwargs:
        raise TypeError(f"chunk_kda got unexpected arguments {sorted(kwargs)}")
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states is not supported by cake")
    errors = ops.safe_gate_errors(safe_gate, use_gate_in_kernel, lower_bound)
    if errors:
        raise ValueError(errors[0])
    return ops.run(
        ops.KDA, q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, A_log=A_log,
        dt_bias=dt_bias, use_qk_l2norm=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel,
        lower_bound=lower_bound if use_gate_in_kernel else None,
        use_beta_sigmoid=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, save_for_backward=None)
