"""Exact segments on one GPU: a call whose documents are few and long for the GPU's SMs walks them
as P segments in parallel.

One walk per (document, value head) runs its chunks in sequence, so 4 documents of 64K tokens at 4
value heads occupy 16 of the H200's 132 SMs for the whole walk. Cut every document into P
segments and each segment's walk is P times shorter: cake.kcp does it exactly on one rank (each
segment's affine summary, their composition along the document, then every segment walked again
from its true start state; docs/design/context-parallel.md). The segment plan (src/plan/
segments.cpp) picks P from the document lengths, the value-head count and the SM count, and
P = 1 (the plain op) where it predicts no gain, as for packs of many documents or many heads.

GDN only: KDA's chunk pass (the gated K K^T and its solve) costs about four times its walk, and
the segments' summary walks run it twice more per token, which the plan's walk-step cost leaves
out. Measured on the H100 (2026-12-06, KDA pack P4 at 16 heads, where the plan picks P = 4): the
forward took 53.5 ms with segments against 24.6 ms without, forward + backward 133.5 against
111.6 ms. cake.kcp still cuts KDA calls into segments where asked (``segments=``).

The plan needs the document offsets on the host. A call gets them from ``cu_seqlens_cpu``,
flash-linear-attention's argument for the host copy of ``cu_seqlens``: without it the call reads
nothing back from the device to plan and runs the plain op. Contexts are kept per offsets,
device and stream (the last few), so a batch seen again plans nothing: a context's plan is copied
to the device in its stream's order, so no stream reads copies another has not finished, and
none frees memory another still reads. Under torch.compile and during CUDA graph capture the
plain op runs (building a context copies its plan to the device).
"""

from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

from . import kcp
from .kcp import ops as kcp_ops
from .options import GATED_DELTA_RULE, DeltaOptions, Op

# The contexts of the last few batches, by (offsets, device, stream): a training loop that cycles
# through a few fixed packings plans each once.
_CONTEXTS: "OrderedDict[tuple, kcp.Context]" = OrderedDict()
_KEPT_CONTEXTS = 8


def runs_kernels(q: Tensor) -> bool:
    """Whether a call on q runs the CUDA kernels (segments help the kernels' walks only: the CPU
    reference walks every token of a document in one thread anyway)."""
    return q.is_cuda


def _stream_of(q: Tensor):
    """The current stream of q's device (None on the CPU): each stream keeps its own contexts."""
    if not q.is_cuda:
        return None
    stream = torch.cuda.current_stream(q.device)
    return stream.device_index, stream.stream_id


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _host_offsets(cu_seqlens: Tensor, cu_seqlens_cpu, T: int) -> list[int]:
    """cu_seqlens_cpu as a list of ints, checked against what is known on the host of cu_seqlens
    (its length) and of the batch (T tokens); its values are trusted, as flash-linear-attention
    trusts them."""
    if not isinstance(cu_seqlens_cpu, Tensor) or cu_seqlens_cpu.device.type != "cpu":
        raise ValueError(f"cu_seqlens_cpu must be a CPU tensor (the host copy of "
                         f"cu_seqlens), got {type(cu_seqlens_cpu).__name__}"
                         + (f" on {cu_seqlens_cpu.device}" if isinstance(cu_seqlens_cpu, Tensor)
                            else ""))
    if cu_seqlens_cpu.dim() != 1 or cu_seqlens_cpu.is_floating_point():
        raise ValueError(f"cu_seqlens_cpu must be a 1-D integer tensor, got "
                         f"{cu_seqlens_cpu.dtype} of shape {tuple(cu_seqlens_cpu.shape)}")
    if cu_seqlens_cpu.shape != cu_seqlens.shape:
        raise ValueError(f"cu_seqlens_cpu must have cu_seqlens's shape "
                         f"{tuple(cu_seqlens.shape)}, got {tuple(cu_seqlens_cpu.shape)}")
    offsets = [int(x) for x in cu_seqlens_cpu.tolist()]
    if offsets and offsets[0] != 0:
        raise ValueError(f"cu_seqlens_cpu must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens_cpu must be non-decreasing, got {offsets}")
    if offsets and offsets[-1] != T:
        raise ValueError(f"cu_seqlens_cpu must end at the batch's T = {T} tokens, got "
                         f"{offsets[-1]}")
    return offsets


def context_for(opts: DeltaOptions, q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor],
                cu_seqlens_cpu, initial_state: Optional[Tensor]) -> Optional[kcp.Context]:
    """The one-rank context that walks this call's documents as segments, or None where the call
    runs the plain op: no host offsets, not the kernels, a form cake.kcp does not take, inside
    torch.compile or a graph capture, arguments the plain op's checks refuse but cake.kcp would
    take (a cu_seqlens of another dtype: cake.kcp reads the host offsets; a CUDA initial_state
    not in float32: cake.kcp casts states), KDA (see above), or a plan of one segment."""
    if cu_seqlens_cpu is None or cu_seqlens is None or torch.compiler.is_compiling():
        return None  # (under torch.compile: no host values read while tracing)
    if not isinstance(cu_seqlens, Tensor) or q.dim() != 4 or v.dim() != 4 or q.shape[0] != 1:
        return None  # the op's own validation reports these
    offsets = _host_offsets(cu_seqlens, cu_seqlens_cpu, q.shape[1])
    if (not runs_kernels(q) or opts.return_intermediate_states
            or opts.variant != GATED_DELTA_RULE.variant):
        return None
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        return None
    if q.is_cuda and initial_state is not None and initial_state.dtype != torch.float32:
        return None
    key = (tuple(offsets), q.device, _stream_of(q))
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        num_sms = _num_sms(q.device) if q.is_cuda else 132
        # world_size=1: one rank, even where torch.distributed is initialised (data parallel)
        ctx = kcp.build_context(offsets, world_size=1, num_sms=num_sms, device=q.device)
        _CONTEXTS[key] = ctx
        while len(_CONTEXTS) > _KEPT_CONTEXTS:
            _CONTEXTS.popitem(last=False)
    _CONTEXTS.move_to_end(key)
    return ctx if ctx.segments_for(v.shape[2]) > 1 else None


def run(op: Op, ctx: kcp.Context, q, k, v, g, beta, initial_state, A_log, dt_bias, options: dict):
    """The call through cake.kcp on ctx, with the caller's options (flash-linear-attention's
    names; save_for_backward has no effect there: cake.kcp's forward keeps its own set).
    ValueError where cake.kcp refuses the arguments, before any work (the caller then runs the
    plain op, whose errors name the argument as they always do)."""
    return kcp_ops._run(op, q, k, v, g, beta, ctx, initial_state, A_log, dt_bias, {},
                        **options)
