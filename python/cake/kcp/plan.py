"""The call plan of a context-parallel op: every index and offset one call needs, built on the host
once per context and segment count P, uploaded to the device without waiting (pinned memory,
non-blocking copies) and then reused by every call, so that a call reads nothing back from the
device and can be captured in a CUDA graph.

Segments: the rank's fragments cut by segment_bounds; segment s holds local tokens
[seg_cu[s], seg_cu[s + 1]) and fragment i holds segments first[i] .. first[i] + count[i] - 1.

The compositions of docs/design/context-parallel.md run as batched scans (Scan): every item (a
fragment) walks its own list of records, all items in lock step, one batched product per step.
Items are sorted by list length, longest first, so that the items still walking at step l are a
prefix of the batch (a view, no mask).
"""

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from .. import abi
from ..options import CHUNK_SIZE


def upload(values: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """values as a tensor on device, copied from pinned memory without waiting for the device
    (a plain torch.tensor(..., device="cuda") waits for the stream)."""
    return upload_tensor(torch.tensor(list(values), dtype=dtype), device)


def upload_tensor(host: Tensor, device: torch.device) -> Tensor:
    """A host tensor on device, as upload does."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class Scan:
    """Items walking lists in lock step: item i walks columns[c][i] for every column c (lists of
    equal length per item).

    order: int64 [n], the items longest list first (positions in the caller's item list).
    steps: per step l, (n_l, (column_0, column_1, ...)): the first n_l items of ``order`` take a
        step; column_c (int64 [n_l]) holds their entries of column c at step l (rows they read,
        or where they write).
    """
    order: Tensor
    steps: tuple[tuple[int, tuple[Tensor, ...]], ...]


def make_scan(columns: Sequence[Sequence[Sequence[int]]], device: torch.device) -> Scan:
    """The scan of items whose lists are columns[c][i]."""
    lists = columns[0]
    order = sorted(range(len(lists)), key=lambda i: -len(lists[i]))
    steps = []
    for step in range(len(lists[order[0]]) if lists else 0):
        walking = [i for i in order if len(lists[i]) > step]
        steps.append((len(walking), tuple(upload([col[i][step] for i in walking], torch.int64,
                                                 device) for col in columns)))
    return Scan(upload(order, torch.int64, device), tuple(steps))


class Span(NamedTuple):
    """One segment's run of rows in the summaries walk and of tokens in the shard, and what it
    reads or writes (item: its segment, or its adjoint row)."""
    item: int
    token: int
    row: int
    length: int


# Spans of at least this many rows take their products in place, one each (cake.kcp.ops: the
# operands and o as strided views, no gathered copies); shorter ones are gathered into batches.
# A gathered row costs ~50 KB of copies at 48 value heads (~16 ns), a product's launch ~10-20 us
# of host time: at 2048 rows the copies would cost about twice a launch.
LONG_SPAN_ROWS = 2048


@dataclass(frozen=True)
class SpanBatch:
    """Short spans padded to one length L, so that one batched product serves them all
    (cake.kcp.ops: o from O_M S_in, C = O_M^T dout).

    items: int64 [n], per span what it reads or writes (its segment, or its adjoint row).
    rows: int64 [n, L], each span's rows in the summaries walk, the padding its first row again.
    tokens: int64 [n, L], the same rows' tokens in the shard, padded likewise.
    out_tokens: int64 [n L], where the rows of rows.flatten() go in o: their tokens, the padding
        at the shard's token count (a row past the shard's end, which o's scatter drops).
    padding_at: int64 [n L - m], the positions of the padding rows in rows.flatten().
    """
    items: Tensor
    rows: Tensor
    tokens: Tensor
    out_tokens: Tensor
    padding_at: Tensor


# Rows of one batched product of spans at most (beyond it, a length's spans take several): at 48
# value heads and K = 128, ~400 MB of bf16 operand, so that the padded copies stay bounded.
SPAN_BATCH_ROWS = 32768


@dataclass(frozen=True)
class SpanProducts:
    """A list of spans as its products take them: the long spans one by one, in place (runs),
    the short ones in batches."""
    runs: tuple[Span, ...] = ()
    batches: tuple[SpanBatch, ...] = ()


def padded_length(n: int) -> int:
    """The rows of a span of n > 0 rows in its batched product: n rounded up to a multiple of a
    sixteenth of its octave, at least a chunk. Under an eighth of a long span's rows are padding,
    at up to 16 lengths (batches) an octave; to the next power of two instead, the spans of
    packs P1 and P5 at W = 4 took 1.5x their rows, and every gathered operand and product with
    them."""
    granule = max(CHUNK_SIZE, 1 << max(0, (n - 1).bit_length() - 4))
    return -(-n // granule) * granule


def span_products(spans: Sequence[Span], num_tokens: int, device) -> SpanProducts:
    """spans (of a shard of num_tokens) as their products take them: those of LONG_SPAN_ROWS rows
    or more as runs; the others padded to padded_length, a length's spans in batches of at most
    SPAN_BATCH_ROWS rows (a span longer than half of that a batch of its own, unpadded: reached
    only where LONG_SPAN_ROWS is raised past it, as the benchmark's all-batched arm does). Spans
    of no rows are left out (their o has no row, their C is zero)."""
    runs = tuple(span for span in spans if span.length >= LONG_SPAN_ROWS)
    by_length: dict[int, list] = {}
    for span in spans:
        n = span.length
        if 0 < n < LONG_SPAN_ROWS:
            L = n if n > SPAN_BATCH_ROWS // 2 else padded_length(n)
            by_length.setdefault(L, []).append(span)
    batches = []
    for L, group in sorted(by_length.items()):
        step = max(1, SPAN_BATCH_ROWS // L)
        for i in range(0, len(group), step):
            items, at, row_at, n = torch.tensor(group[i:i + step], dtype=torch.int64).unbind(1)
            t = torch.arange(L)
            real = t < n[:, None]  # [spans, L]
            offset = torch.where(real, t, 0)
            rows, tokens = row_at[:, None] + offset, at[:, None] + offset
            out_tokens = torch.where(real, tokens, num_tokens).flatten()
            batches.append(SpanBatch(*(upload_tensor(x, device) for x in (
                items, rows, tokens, out_tokens, (~real).flatten().nonzero().squeeze(1)))))
    return SpanProducts(runs, tuple(batches))


@dataclass(frozen=True)
class WalkSet:
    """Some of the rank's segments walked as one packed problem (one sequence per segment).

    index: int64 [T_set], the set's local tokens in walk order (None: the whole shard in order).
    offsets: int32 [S_set + 1], the walk's cu_seqlens.
    segments: the segments in walk order (host), and as int64 [S_set] on the device.
    """
    index: Optional[Tensor]
    offsets: Tensor
    segments: tuple[int, ...]
    segment_index: Tensor

    def take(self, x: Tensor) -> Tensor:
        """The set's tokens of x [1, T_local, ...]: [1, T_set, ...]."""
        return x if self.index is None else x.index_select(1, self.index)


@dataclass(frozen=True)
class CallPlan:
    """What one op call on this rank walks and composes (see the module docstring). Index tensors
    are int64 on the device; None where there is nothing of the kind.

    shard: every segment; summaries: the segments whose records (M, B) the forward needs, walked
    twice (from S_in = 0 and from S_in = I with v = 0); rest: the other segments, walked once
    from their true S_in. Rows: a segment's position in the summaries walk (records, M) or in the
    adjoints (C).
    summary_spans: the summary rows' spans (items: their segments), as their products take them:
    where their o is put together from the summary walks' outputs.
    """
    num_segments: int
    shard: WalkSet
    summaries: Optional[WalkSet]
    summary_spans: SpanProducts
    rest: Optional[WalkSet]
    # Forward records of the state_out fragments: their segments' records composed (scan over
    # the records' rows), sent at out_slots; the first pieces among them (positions in that list
    # and their documents) take the initial state into their record.
    out_records: Optional[Scan]
    out_slots: Optional[Tensor]
    out_first_pieces: Optional[tuple[Tensor, Tensor]]
    # S_in of the state_in fragments (positions in_fragments): their chains of gathered records
    # (rows rank * slots + slot), first piece first.
    in_chain: Optional[Scan]
    in_fragments: Optional[Tensor]
    # S_in of the other fragments (own_fragments): the initial state of own_documents.
    own_fragments: Optional[Tensor]
    own_documents: Optional[Tensor]
    # A fragment's S_in is its first segment's; along its segments: (record row of s - 1, s).
    first_segments: Tensor
    along: Optional[Scan]
    # Final states: the last segments of the documents' last pieces, and those documents.
    last_segments: Optional[Tensor]
    last_documents: Optional[Tensor]
    # The adjoint rows' spans (items: the rows), as their products take them: the tokens whose
    # outputs' gradients make each row's C; and how many rows there are (0 without gradients).
    adjoint_spans: SpanProducts = SpanProducts()
    num_adjoints: int = 0
    # Adjoint records of the state_in fragments, from the last segment back: (C row, M row);
    # sent at adjoint_slots; the documents' last pieces among them take dht into their record.
    adjoint_records: Optional[Scan] = None
    adjoint_slots: Optional[Tensor] = None
    adjoint_last_pieces: Optional[tuple[Tensor, Tensor]] = None
    # dS_out of the state_out fragments (out_fragments): chains of gathered adjoint records,
    # last piece first.
    out_chain: Optional[Scan] = None
    out_fragments: Optional[Tensor] = None
    # dS_out of the documents' last pieces (last_fragments): dht of their documents
    # (last_documents).
    last_fragments: Optional[Tensor] = None
    # A fragment's dS_out is its last segment's (last_segment_of); back along its segments:
    # (C row of s + 1, M row of s + 1, s).
    last_segment_of: Optional[Tensor] = None
    back_along: Optional[Scan] = None


def _segments(fragments, P: int) -> tuple[list[int], list[int], list[int]]:
    cu, first, count = [0], [], []
    for f in fragments:
        bounds = abi.kcp.segment_bounds(f.num_chunks, P)
        first.append(len(cu) - 1)
        count.append(len(bounds) - 1)
        begin = f.local_range.begin
        cu.extend(begin + min(b * CHUNK_SIZE, f.num_tokens) for b in bounds[1:])
    return cu, first, count


def _walk_set(seg_cu: list[int], first, count, fragments: list[int], whole: bool,
              device) -> WalkSet:
    """The packed problem of the chosen fragments' segments (whole: they are the shard)."""
    index, cu, segments = [], [0], []
    for i in fragments:
        begin, end = seg_cu[first[i]], seg_cu[first[i] + count[i]]
        index.extend(range(begin, end))
        shift = cu[-1] - begin
        for s in range(first[i], first[i] + count[i]):
            cu.append(seg_cu[s + 1] + shift)
            segments.append(s)
    return WalkSet(None if whole else upload(index, torch.int64, device),
                   upload(cu, torch.int32, device), tuple(segments),
                   upload(segments, torch.int64, device))


def _subset(seg_cu: list[int], first, count, F: int, device,
            fragments: list[int]) -> tuple[Optional[WalkSet], list[int]]:
    """The walk set of the chosen fragments' segments (None when none is chosen), and each
    segment's row in it (-1 where it is not walked)."""
    walk = _walk_set(seg_cu, first, count, fragments, len(fragments) == F, device) \
        if fragments else None
    row = [-1] * (len(seg_cu) - 1)
    for j, s in enumerate(walk.segments if walk else ()):
        row[s] = j
    return walk, row


def build_plan(ctx, P: int, slots: tuple[int, int], has_h0: bool, needs_grad: bool,
               device: torch.device) -> CallPlan:
    """The plan of one call on ctx's rank: at most P segments per fragment; slots: records per
    rank in the forward and the backward exchange (ExchangeBytes.forward_slots, backward_slots).
    """
    fragments = ctx.fragments
    F = len(fragments)
    seg_cu, first, count = _segments(fragments, P)
    S = len(seg_cu) - 1
    i64 = lambda xs: upload(xs, torch.int64, device) if xs else None  # noqa: E731
    segs = lambda i: list(range(first[i], first[i] + count[i]))  # noqa: E731
    shard = _walk_set(seg_cu, first, count, list(range(F)), True, device)

    summarized = [i for i, f in enumerate(fragments)
                  if f.state_out or count[i] > 1 or (f.state_in and needs_grad)]
    summaries, row = _subset(seg_cu, first, count, F, device, summarized)
    rest, _ = _subset(seg_cu, first, count, F, device, sorted(set(range(F)) - set(summarized)))
    spans, at = [], 0  # the summaries walk packs its segments in order
    for s in summaries.segments if summaries else ():
        spans.append(Span(s, seg_cu[s], at, seg_cu[s + 1] - seg_cu[s]))
        at += seg_cu[s + 1] - seg_cu[s]
    outs = [i for i, f in enumerate(fragments) if f.state_out]
    firsts = [j for j, i in enumerate(outs) if fragments[i].piece == 0] if has_h0 else []
    ins = [i for i, f in enumerate(fragments) if f.state_in]
    own = [i for i, f in enumerate(fragments) if not f.state_in] if has_h0 else []
    lasts = [i for i, f in enumerate(fragments) if not f.state_out]
    plan = CallPlan(
        num_segments=S, shard=shard, summaries=summaries,
        summary_spans=span_products(spans, seg_cu[-1], device), rest=rest,
        out_records=make_scan([[[row[s] for s in segs(i)] for i in outs]], device)
        if outs else None,
        out_slots=i64([fragments[i].summary_slot for i in outs]),
        out_first_pieces=(i64(firsts), i64([fragments[outs[j]].document for j in firsts]))
        if firsts else None,
        in_chain=make_scan([[_chain(ctx, fragments[i], "previous", slots[0]) for i in ins]],
                           device) if ins else None,
        in_fragments=i64(ins), own_fragments=i64(own),
        own_documents=i64([fragments[i].document for i in own]),
        first_segments=upload(first, torch.int64, device),
        along=make_scan([[[row[s] for s in segs(i)[:-1]] for i in range(F)],
                         [segs(i)[1:] for i in range(F)]], device)
        if F and max(count) > 1 else None,
        last_segments=i64([first[i] + count[i] - 1 for i in lasts]),
        last_documents=i64([fragments[i].document for i in lasts]))
    if not needs_grad:
        return plan

    adjoint_segments = [s for i, f in enumerate(fragments) if f.state_in or count[i] > 1
                        for s in segs(i)]
    arow = [-1] * S
    for j, s in enumerate(adjoint_segments):
        arow[s] = j
    back = lambda i: segs(i)[::-1]  # noqa: E731
    ends = [j for j, i in enumerate(ins) if not fragments[i].state_out]
    return dataclasses.replace(
        plan, adjoint_spans=span_products([spans[row[s]]._replace(item=j)
                                           for j, s in enumerate(adjoint_segments)], seg_cu[-1],
                                          device),
        num_adjoints=len(adjoint_segments),
        adjoint_records=make_scan([[[arow[s] for s in back(i)] for i in ins],
                                   [[row[s] for s in back(i)] for i in ins]], device)
        if ins else None,
        adjoint_slots=i64([fragments[i].adjoint_slot for i in ins]),
        adjoint_last_pieces=(i64(ends), i64([fragments[ins[j]].document for j in ends]))
        if ends else None,
        out_chain=make_scan([[_chain(ctx, fragments[i], "next", slots[1]) for i in outs]],
                            device) if outs else None,
        out_fragments=i64(outs), last_fragments=i64(lasts),
        last_segment_of=upload([first[i] + count[i] - 1 for i in range(F)], torch.int64, device),
        back_along=make_scan([[[arow[s + 1] for s in back(i)[1:]] for i in range(F)],
                              [[row[s + 1] for s in back(i)[1:]] for i in range(F)],
                              [back(i)[1:] for i in range(F)]], device)
        if F and max(count) > 1 else None)


def _chain(ctx, f, direction: str, slots: int) -> list[int]:
    """The rows (rank * slots + slot) of the gathered records of the pieces before ("previous":
    forward records, first piece first) or after ("next": adjoint records, last piece first)
    fragment f, in the order they apply."""
    out = []
    ref = getattr(f, direction)
    while ref is not None:
        other = ctx.shards[ref.rank].fragments[ref.index]
        slot = other.summary_slot if direction == "previous" else other.adjoint_slot
        out.append(ref.rank * slots + slot)
        ref = getattr(other, direction)
    out.reverse()
    return out
