"""The options of the delta-rule ops, defined once.

``cake.chunk_gated_delta_rule``, ``cake.chunk_kda`` and their context-parallel forms in
``cake.kcp`` take flash-linear-attention's argument names; ``parse`` turns them into one
``DeltaOptions`` (what the C ABI's cakeOptions_t and the Python layer need) and the list of what
is wrong with them. The single-rank functions raise the first message; the context-parallel ones
agree on the messages across ranks before raising, so that no rank waits for another.
"""

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

GDN, KDA = 0, 1  # cakeVariant_t

# The modes of save_for_backward and their options.save_for_backward (include/cake/cake.h).
SAVE_MODES = {"recompute": 0, "saved": 1, "inverse": 2}

# The trailing (save_for_backward, unordered_sums) of the op calls cake makes for itself (the
# intermediate states, cake.kcp's walks, the CUDA support check): nothing saved (a backward
# recomputes), sums in their fixed order.
RECOMPUTE_ORDERED = (SAVE_MODES["recompute"], False)

# The chunk size cake computes with; the others flash-linear-attention accepts give the same
# result (the chunked form is exact for any chunk size), so they are accepted and computed at 64.
CHUNK_SIZE = 64


@dataclass(frozen=True)
class Op:
    """One public op: its name, its variant and the chunk sizes flash-linear-attention accepts."""
    name: str
    variant: int
    chunk_sizes: tuple[int, ...]


GATED_DELTA_RULE = Op("chunk_gated_delta_rule", GDN, (16, 32, 64))
KDA_OP = Op("chunk_kda", KDA, (32, 64))


@dataclass(frozen=True)
class DeltaOptions:
    """The parsed options of one call (scale None: K^-1/2, resolved when q is known)."""
    op: Op
    scale: Optional[float]
    output_final_state: bool
    use_qk_l2norm: bool
    use_gate_in_kernel: bool
    lower_bound: Optional[float]
    use_beta_sigmoid: bool
    allow_neg_eigval: bool
    state_v_first: bool
    save_for_backward: Optional[str]
    return_intermediate_states: bool
    chunk_size: int
    unordered_sums: bool  # not deterministic: cakeOptions_t's unordered_sums

    @property
    def variant(self) -> int:
        return self.op.variant

    def flags(self) -> tuple:
        """The options between scale and the save mode in the C ABI's order (cake.abi)."""
        return (self.use_qk_l2norm, self.use_gate_in_kernel, self.lower_bound,
                self.use_beta_sigmoid, self.allow_neg_eigval)


def parse(op: Op, *, scale=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
          use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
          safe_gate=False, lower_bound=None, disable_recompute=False,
          return_intermediate_states=False, state_v_first=False, transpose_state_layout=None,
          chunk_size=CHUNK_SIZE, head_first=None, save_for_backward=None, deterministic=True,
          A_log=None, dt_bias=None, num_v_heads=None, head_dim_k=None, stacklevel=3):
    """(DeltaOptions, A_log, dt_bias, errors) of one call.

    A_log and dt_bias come back flattened to the C ABI's [HV] and [HV * K] (GDN: [HV]) when they
    hold that many elements (flash-linear-attention accepts any shape, e.g. [1, 1, HV, 1]), and
    None without use_gate_in_kernel (flash-linear-attention ignores them then). num_v_heads and
    head_dim_k (None when v or q have the wrong rank; the C++ validation reports those) give the
    element counts. errors: messages, empty when the options are valid (save_for_backward is
    checked where its default is known, cake.ops).
    """
    errors = []
    if head_first is not None:
        errors.append("head_first has been removed: inputs must be in [B, T, H, ...] format")
    if transpose_state_layout is not None:
        if state_v_first:
            errors.append("cannot pass both state_v_first and the deprecated "
                          "transpose_state_layout")
        else:
            warnings.warn("transpose_state_layout is deprecated: use state_v_first",
                          DeprecationWarning, stacklevel=stacklevel)
            state_v_first = bool(transpose_state_layout)
    if chunk_size not in op.chunk_sizes:
        errors.append(f"chunk_size must be one of {op.chunk_sizes} for {op.name}, got "
                      f"{chunk_size}")
    if not isinstance(deterministic, bool):
        errors.append(f"deterministic must be True or False, got {deterministic!r}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        errors.append("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    if op.variant == KDA:
        if safe_gate and use_gate_in_kernel:
            if lower_bound is None:
                errors.append("lower_bound must be given when safe_gate=True and "
                              "use_gate_in_kernel=True")
            elif not -5 <= lower_bound < 0:
                errors.append(f"lower_bound must be in the safe range [-5, 0), got {lower_bound}")
        if return_intermediate_states:
            if not torch.is_inference_mode_enabled():
                errors.append("return_intermediate_states=True is only allowed under "
                              "torch.inference_mode() (it returns the per-chunk states without "
                              "their gradients)")
            if disable_recompute:
                errors.append("return_intermediate_states=True needs disable_recompute=False")

    if use_gate_in_kernel:
        A_log = _flat(A_log, num_v_heads)
        per_channel = op.variant == KDA and num_v_heads is not None and head_dim_k is not None
        dt_bias = _flat(dt_bias, num_v_heads * head_dim_k if per_channel else
                        num_v_heads if op.variant == GDN else None)
    else:
        A_log = dt_bias = None
    options = DeltaOptions(
        op=op, scale=None if scale is None else float(scale),
        output_final_state=bool(output_final_state), use_qk_l2norm=bool(use_qk_l2norm_in_kernel),
        use_gate_in_kernel=bool(use_gate_in_kernel),
        lower_bound=float(lower_bound) if use_gate_in_kernel and lower_bound is not None else None,
        use_beta_sigmoid=bool(use_beta_sigmoid_in_kernel), allow_neg_eigval=bool(allow_neg_eigval),
        state_v_first=bool(state_v_first), save_for_backward=save_for_backward,
        return_intermediate_states=bool(return_intermediate_states), chunk_size=chunk_size,
        unordered_sums=deterministic is False)
    return options, A_log, dt_bias, errors


def _flat(x: Optional[Tensor], numel: Optional[int]) -> Optional[Tensor]:
    """x as a 1-D view when it holds numel elements; else unchanged, for the validation to name."""
    if isinstance(x, Tensor) and numel is not None and x.dim() != 1 and x.numel() == numel:
        return x.reshape(numel)
    return x
