"""The context of one packed batch under context parallelism: this rank's shard and fragments, the
exchange, the segment plan, and shard / unshard of packed tensors.

The tables come from the C++ planning (src/plan/partition.hpp, segments.hpp) through cake.abi.kcp;
every rank builds every rank's table from the global cu_seqlens, so no table is communicated.
docs/design/context-parallel.md describes layouts, fragments, summaries and the segment plan.
"""

import hashlib
import operator
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import abi
from . import check
from .exchange import (DistributedExchange, Exchange, SingleExchange, agree,
                       header_bytes)
from .plan import CallPlan, build_plan, upload

LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
CHUNK_SIZE = int(abi.kcp.CHUNK_SIZE)
MAX_SEGMENTS = int(abi.kcp.MAX_SEGMENTS)

# The header every op call all-gathers before its summaries (cake.kcp.ops): int64 fields.
OP_HEADER_FIELDS = (
    "context", "variant", "num_heads", "num_v_heads", "head_dim_k", "head_dim_v", "dtype",
    "device_type", "scale", "flags", "lower_bound", "forward_slots", "needs_grad")

# The header of a causal_conv1d_kcp call (cake.kcp.conv1d): int64 fields.
CONV_HEADER_FIELDS = ("context", "dim", "width", "dtype", "device_type", "activation", "flags",
                      "x_requires_grad")

_CONTEXT_FIELDS = ("rank", "cu_seqlens_global (hash)", "num_documents", "num_tokens",
                   "world_size", "layout", "segments", "num_sms")


@dataclass(frozen=True)
class TokenRange:
    """Tokens [begin, end) in a global or local numbering."""
    begin: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class FragmentRef:
    """fragments[index] of rank ``rank``'s shard."""
    rank: int
    index: int


@dataclass(frozen=True)
class Fragment:
    """One piece of one document held by one rank, walked as one local sequence.

    state_in: the incoming state is the final state of ``previous`` (piece > 0).
    state_out: the final state continues on ``next`` (not the document's last piece).
    summary_slot / adjoint_slot: this fragment's record in its rank's forward / backward exchange.
    """
    document: int
    piece: int
    num_pieces: int
    global_range: TokenRange
    local_range: TokenRange
    state_in: bool
    state_out: bool
    previous: Optional[FragmentRef]
    next: Optional[FragmentRef]
    summary_slot: Optional[int]
    adjoint_slot: Optional[int]

    @property
    def num_tokens(self) -> int:
        return self.global_range.size

    @property
    def num_chunks(self) -> int:
        return -(-self.num_tokens // CHUNK_SIZE)


@dataclass(frozen=True)
class Shard:
    """One rank's tokens: its global ranges in local order, local cu_seqlens [F + 1], fragments."""
    rank: int
    global_ranges: tuple[TokenRange, ...]
    cu_seqlens: tuple[int, ...]
    fragments: tuple[Fragment, ...]
    num_summaries: int
    num_adjoints: int

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]


@dataclass(frozen=True)
class ExchangeBytes:
    """Bytes one rank sends and receives per op call (a delta-rule op's first call of its sizes on
    an exchange also all-gathers header_bytes to agree them, cake.kcp.check). Forward: the header
    and the records of the state_out fragments; backward: the records of the state_in fragments;
    ``*_slots`` records per rank, receive = (W - 1) * send. Delta-rule ops: summary and adjoint
    records [HV, K, K + V] in the state dtype (float32, or float64 for float64 inputs).
    causal_conv1d_kcp: halo records [W_conv - 1, D] in x's dtype (its tokens forward, their
    gradients backward)."""
    header_bytes: int
    record_bytes: int
    forward_slots: int
    backward_slots: int
    forward_send: int
    forward_receive: int
    backward_send: int
    backward_receive: int


def _ref(r) -> Optional[FragmentRef]:
    return FragmentRef(r.rank, r.index) if r.rank >= 0 else None


def _slot(s: int) -> Optional[int]:
    return s if s >= 0 else None


def _shard(raw) -> Shard:
    fragments = tuple(
        Fragment(f.document, f.piece, f.num_pieces,
                 TokenRange(f.global_range.begin, f.global_range.end),
                 TokenRange(f.local_range.begin, f.local_range.end), f.state_in, f.state_out,
                 _ref(f.previous), _ref(f.next), _slot(f.summary_slot), _slot(f.adjoint_slot))
        for f in raw.fragments)
    return Shard(raw.rank, tuple(TokenRange(x.begin, x.end) for x in raw.global_ranges),
                 tuple(raw.cu_seqlens), fragments, raw.num_summaries, raw.num_adjoints)


def _as_int_list(cu_seqlens_global) -> list[int]:
    if isinstance(cu_seqlens_global, Tensor):
        if cu_seqlens_global.dim() != 1 or cu_seqlens_global.is_floating_point():
            raise ValueError("cu_seqlens_global must be a 1-D integer tensor [N + 1], got "
                             f"{cu_seqlens_global.dtype} of shape {tuple(cu_seqlens_global.shape)}")
        return [int(x) for x in cu_seqlens_global.tolist()]
    try:
        values = list(cu_seqlens_global)
    except TypeError:
        raise ValueError("cu_seqlens_global must be a 1-D integer tensor or a sequence of ints, "
                         f"got {type(cu_seqlens_global).__name__}") from None
    bad = [x for x in values if isinstance(x, bool) or not _is_integer(x)]
    if bad:
        raise ValueError("cu_seqlens_global must be a 1-D integer tensor or a sequence of ints, "
                         f"got {bad[0]!r} among its values")
    return [operator.index(x) for x in values]


def _is_integer(x) -> bool:
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


class Context:
    """One rank's view of one packed batch split over W ranks (build it with build_context).

    Attributes:
        rank, world_size, layout: as given or taken from the group / exchange.
        cu_seqlens_global: the global offsets, a tuple of N + 1 ints.
        cu_seqlens: this rank's local offsets, int32 [F + 1] on cu_seqlens_global's device.
        fragments: this rank's fragments in local order; global_ranges: its global token ranges.
        shards: every rank's Shard (shard: this rank's).
        segments: the segments= override (1..16), or None for the plan rule.
        exchange: the Exchange (None for a planning-only context of several ranks).
    """

    def __init__(self, cu_seqlens_global: Sequence[int], shards: Sequence[Shard], rank: int,
                 layout: str, segments: Optional[int], num_sms: int,
                 exchange: Optional[Exchange], device: torch.device):
        self.cu_seqlens_global = tuple(cu_seqlens_global)
        self.shards = tuple(shards)
        self.rank = rank
        self.world_size = len(shards)
        self.layout = layout
        self.segments = segments
        self.num_sms = num_sms
        self.exchange = exchange
        self.device = device
        self.shard = self.shards[rank]
        self.fragments = self.shard.fragments
        self.global_ranges = self.shard.global_ranges
        self.cu_seqlens = upload(self.shard.cu_seqlens, torch.int32, device)
        self.fingerprint = _fingerprint(self.cu_seqlens_global, self.world_size, layout,
                                        segments or 0, num_sms)
        self._plans: dict[int, tuple[int, ...]] = {}
        self._bytes: dict[tuple, ExchangeBytes] = {}
        self._call_plans: dict[tuple, CallPlan] = {}
        self._headers: dict[tuple, Tensor] = {}
        self._cu_seqlens_on: dict[torch.device, Tensor] = {}

    def cu_seqlens_on(self, device: torch.device) -> Tensor:
        """The local cu_seqlens (int32 [F + 1]) on device: copied once, without waiting, and
        kept."""
        if device == self.cu_seqlens.device:
            return self.cu_seqlens
        if device not in self._cu_seqlens_on:
            self._cu_seqlens_on[device] = upload(self.shard.cu_seqlens, torch.int32, device)
        return self._cu_seqlens_on[device]

    def call_plan(self, segments: int, has_h0: bool, needs_grad: bool,
                  device: torch.device) -> CallPlan:
        """The indices and offsets of an op call on this rank (cake.kcp.plan), on device: made by
        the first call of a kind and kept, so that later calls copy nothing from the host."""
        key = (segments, has_h0, needs_grad, device)
        if key not in self._call_plans:
            # Record slots per rank depend on the fragments only, not on HV, K, V.
            sizes = self.exchange_bytes(1, 1, 1)
            self._call_plans[key] = build_plan(self, segments,
                                               (sizes.forward_slots, sizes.backward_slots),
                                               has_h0, needs_grad, device)
        return self._call_plans[key]

    def call_header(self, fields: dict, ok: bool, device: torch.device) -> Tensor:
        """An op call's header on the device (cake.kcp.check), kept per set of fields."""
        key = (tuple(fields.items()), ok, device)
        if key not in self._headers:
            self._headers[key] = check.header_tensor(fields, ok, device)
        return self._headers[key]

    @property
    def num_documents(self) -> int:
        return len(self.cu_seqlens_global) - 1

    @property
    def num_global_tokens(self) -> int:
        return self.cu_seqlens_global[-1]

    @property
    def num_tokens(self) -> int:
        """Tokens on this rank (T_local)."""
        return self.shard.num_tokens

    @property
    def empty_documents(self) -> tuple[int, ...]:
        """Documents of no tokens: no fragment anywhere; rank 0 passes their initial state on as
        their final state."""
        cu = self.cu_seqlens_global
        return tuple(n for n in range(self.num_documents) if cu[n + 1] == cu[n])

    @property
    def final_documents(self) -> tuple[int, ...]:
        """The documents whose final_state row this rank fills: those whose last piece it holds
        (and, on rank 0, the empty documents)."""
        mine = [f.document for f in self.fragments if not f.state_out]
        if self.rank == 0:
            mine += self.empty_documents
        return tuple(sorted(mine))

    def _raw_shards(self):
        # The C++ tables are rebuilt when needed rather than kept: a context may outlive the
        # extension module (autograd graphs alive at interpreter exit).
        return abi.kcp.partition(list(self.cu_seqlens_global), self.world_size, self.layout)

    def segment_plan(self, num_v_heads: int) -> tuple[int, ...]:
        """P for every rank at num_v_heads value heads: [W] (plan_segments, or the override)."""
        if num_v_heads not in self._plans:
            self._plans[num_v_heads] = tuple(abi.kcp.plan_segments(
                self._raw_shards(), int(num_v_heads), self.num_sms, self.segments or 0))
        return self._plans[num_v_heads]

    def segments_for(self, num_v_heads: int) -> int:
        """This rank's P at num_v_heads value heads."""
        return self.segment_plan(num_v_heads)[self.rank]

    def exchange_bytes(self, num_v_heads: Optional[int] = None, head_dim_k: Optional[int] = None,
                       head_dim_v: Optional[int] = None, dtype: torch.dtype = torch.float32, *,
                       conv_dim: Optional[int] = None,
                       conv_width: Optional[int] = None) -> ExchangeBytes:
        """Bytes this rank sends and receives per forward and per backward of an op call: a
        delta-rule op's (num_v_heads, head_dim_k, head_dim_v; records in ``dtype``, the state
        dtype: float32, float64 for float64 inputs), or causal_conv1d_kcp's (conv_dim D and
        conv_width W; records in ``dtype``, x's dtype)."""
        if conv_dim is not None or conv_width is not None:
            if conv_dim is None or conv_width is None or num_v_heads is not None:
                raise ValueError("exchange_bytes: give conv_dim and conv_width (causal_conv1d_kcp) "
                                 "or num_v_heads, head_dim_k and head_dim_v (the delta rule)")
            key = ("conv1d", conv_dim, conv_width, dtype)
            if key not in self._bytes:
                self._bytes[key] = self._conv_exchange_bytes(conv_dim, conv_width, dtype)
            return self._bytes[key]
        if num_v_heads is None or head_dim_k is None or head_dim_v is None:
            raise ValueError("exchange_bytes: give num_v_heads, head_dim_k and head_dim_v")
        key = (num_v_heads, head_dim_k, head_dim_v, dtype)
        if key not in self._bytes:
            self._bytes[key] = self._exchange_bytes(num_v_heads, head_dim_k, head_dim_v, dtype)
        return self._bytes[key]

    def _conv_exchange_bytes(self, dim: int, width: int, dtype: torch.dtype) -> ExchangeBytes:
        # The halo all-gathers are skipped at W = 1 (no halo); their slots are those of the
        # summaries and adjoints (one per state_out / state_in fragment).
        itemsize = torch.empty(0, dtype=dtype).element_size()
        record = max(width - 1, 0) * dim * itemsize
        forward_slots = max(s.num_summaries for s in self.shards) if width > 1 else 0
        backward_slots = max(s.num_adjoints for s in self.shards) if width > 1 else 0
        header = header_bytes(len(CONV_HEADER_FIELDS))
        forward_send = header + forward_slots * record
        backward_send = backward_slots * record
        others = self.world_size - 1
        return ExchangeBytes(header, record, forward_slots, backward_slots, forward_send,
                             others * forward_send, backward_send, others * backward_send)

    def _exchange_bytes(self, num_v_heads: int, head_dim_k: int, head_dim_v: int,
                        dtype: torch.dtype) -> ExchangeBytes:
        plan = abi.kcp.summary_exchange(self._raw_shards(), int(num_v_heads), int(head_dim_k),
                                       int(head_dim_v))
        itemsize = torch.empty(0, dtype=dtype).element_size()
        record = plan.record_bytes // 4 * itemsize
        header = header_bytes(len(OP_HEADER_FIELDS))
        forward_send = header + plan.forward_slots * record
        backward_send = plan.backward_slots * record
        others = self.world_size - 1
        return ExchangeBytes(header, record, plan.forward_slots, plan.backward_slots,
                             forward_send, others * forward_send, backward_send,
                             others * backward_send)

    def require_exchange(self, what: str) -> Exchange:
        if self.exchange is None:
            raise ValueError(f"{what}: the context has no exchange (it was built with world_size="
                             f"{self.world_size} and neither group= nor exchange=)")
        return self.exchange

    def __repr__(self) -> str:
        return (f"cake.kcp.Context(rank={self.rank}, world_size={self.world_size}, "
                f"layout={self.layout!r}, num_tokens={self.num_tokens}, "
                f"fragments={len(self.fragments)}, segments={self.segments})")


def _fingerprint(cu: Sequence[int], world_size: int, layout: str, segments: int,
                 num_sms: int) -> int:
    text = repr((tuple(cu), world_size, layout, segments, num_sms)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & (2**63 - 1)


def _cu_hash(cu: Sequence[int]) -> int:
    return int.from_bytes(hashlib.sha256(repr(tuple(cu)).encode()).digest()[:8],
                          "little") & (2**63 - 1)


def _resolve_world(group, world_size, rank, exchange) -> tuple[Optional[Exchange], int, int, list]:
    """(exchange, world_size, rank, errors): where W and the rank come from, and what is wrong
    with the arguments (errors are reported after the agreement exchange, on every rank)."""
    errors = []
    if group is not None and exchange is not None:
        raise ValueError("pass group= (torch.distributed) or exchange=, not both")
    if group is not None:
        exchange = DistributedExchange.of(group)
    elif exchange is None and world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            exchange = DistributedExchange.of(None)
    if exchange is not None:
        source = "group" if group is not None else "exchange"
        if world_size is not None and (isinstance(world_size, bool)
                                       or world_size != exchange.world_size):
            errors.append(f"world_size: expected {exchange.world_size} (from {source}), got "
                          f"{world_size}")
        if rank is not None and (isinstance(rank, bool) or rank != exchange.rank):
            errors.append(f"rank: expected {exchange.rank} (from {source}), got {rank}")
        return exchange, exchange.world_size, exchange.rank, errors
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
    return (SingleExchange() if world_size == 1 else None), world_size, rank, errors


def build_context(cu_seqlens_global, group=None, world_size: Optional[int] = None,
                  rank: Optional[int] = None, layout: str = "contiguous",
                  segments: Optional[int] = None, num_sms: int = 132,
                  exchange: Optional[Exchange] = None,
                  device: Optional[torch.device] = None) -> Context:
    """This rank's context for a packed batch of documents (global offsets cu_seqlens_global).

    Args:
        cu_seqlens_global: int tensor or sequence [N + 1]: 0, non-decreasing. The local
            cu_seqlens is put on this tensor's device (CPU for a sequence).
        group: a torch.distributed process group; world_size and rank are taken from it.
        world_size, rank: without group or exchange: a planning-only context (shard, byte
            queries; world_size 1 needs no exchange). With one, they must match it when given.
            With none of the three, the default torch.distributed group is used if initialised.
        layout: "contiguous", "zigzag" or "zigzag_per_document" (docs/design/context-parallel.md).
        segments: None or 0 applies the segment plan rule; 1..16 forces P on every rank.
        num_sms: SMs per GPU, for the plan rule.
        exchange: an Exchange (e.g. VirtualWorld(W).exchange(r)) instead of group.
        device: where the context's tensors live (the local cu_seqlens, the call plans); by
            default cu_seqlens_global's device (CPU for a sequence). They are copied there
            without waiting, in the order of the stream current at the copy (at build, and
            at a call's first use of a plan): use a CUDA context on that stream, or make the
            other stream wait for it.

    When there is an exchange, the ranks all-gather what they must agree on (global cu_seqlens,
    W, layout, segments, num_sms, their rank) once; any difference, or an argument rejected on any
    rank, raises ValueError on every rank. First, the verdicts of the earlier op calls on the
    exchange are read (cake.kcp.check): a disagreement among them raises ValueError on every rank.
    """
    exchange, world_size, rank, errors = _resolve_world(group, world_size, rank, exchange)
    check.raise_pending(exchange)
    cu = None
    try:
        cu = _as_int_list(cu_seqlens_global)
    except ValueError as e:
        errors.append(str(e))
    if layout not in LAYOUTS:
        errors.append(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int)
                                 or not 0 <= segments <= MAX_SEGMENTS):
        errors.append(f"segments must be None or 0 (the plan rule) or an integer in [1, "
                      f"{MAX_SEGMENTS}], got {segments!r}")
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        errors.append(f"num_sms must be an integer >= 1, got {num_sms!r}")
    raw = None
    if not errors:
        try:
            raw = abi.kcp.partition(cu, world_size, layout)
        except ValueError as e:
            errors.append(f"cu_seqlens_global: {e}")
    error = "build_context: " + "; ".join(errors) if errors else None
    if exchange is not None:
        fields = {"rank": rank,
                  "cu_seqlens_global (hash)": _cu_hash(cu) if cu is not None else 0,
                  "num_documents": len(cu) - 1 if cu is not None else 0,
                  "num_tokens": cu[-1] if cu else 0, "world_size": world_size,
                  "layout": LAYOUTS.index(layout) if layout in LAYOUTS else -1,
                  "segments": _int_or(segments, 0),
                  "num_sms": _int_or(num_sms, -1)}
        rows = agree(exchange, "build_context", fields, error, per_rank=("rank",))
        ranks = [row[0] for row in rows]
        if ranks != list(range(world_size)):
            raise ValueError(f"build_context: rank r must sit at position r of the exchange, got "
                             f"ranks {ranks}")
    elif error:
        raise ValueError(error)
    if device is None:
        device = (cu_seqlens_global.device if isinstance(cu_seqlens_global, Tensor)
                  else torch.device("cpu"))
    device = torch.device(device)
    shards = [_shard(s) for s in raw]
    return Context(cu, shards, rank, layout, segments or None, num_sms, exchange, device)


def _int_or(x, none_value: int) -> int:
    """x as a header field: none_value for None, -1 for what is not an integer."""
    if x is None:
        return none_value
    return x if isinstance(x, int) and not isinstance(x, bool) else -1


def _packed_error(x: Tensor, name: str, tokens: int, what: str) -> Optional[str]:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2 or x.shape[0] != 1 or x.shape[1] != tokens:
        return (f"{name} must be a packed tensor [1, {tokens}, ...] ({what}), got "
                f"{tuple(x.shape)}")
    return None


def shard(x: Tensor, ctx: Context) -> Tensor:
    """This rank's tokens of a global packed tensor: [1, T, ...] -> [1, T_local, ...], the rank's
    global ranges in local order. Differentiable (a gather)."""
    error = _packed_error(x, "x", ctx.num_global_tokens, "the global token count of the context")
    if error:
        raise ValueError(f"shard: {error}")
    if not ctx.global_ranges:
        return x[:, :0]
    return torch.cat([x[:, r.begin:r.end] for r in ctx.global_ranges], dim=1)


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x_local: Tensor, ctx: Context, error: Optional[str]) -> Tensor:
        exchange = ctx.require_exchange("unshard")
        trailing = list(x_local.shape[2:])
        fields = {"context": ctx.fingerprint, "ndim": x_local.dim(),
                  "dtype": _dtype_code(x_local.dtype)}
        fields.update({f"size[{d}]": trailing[d - 2] if d < x_local.dim() else -1
                       for d in range(2, 8)})
        if x_local.dim() > 8:
            error = f"x_local has at most 8 dimensions, got {x_local.dim()}"
        agree(exchange, "unshard", fields, error and f"unshard: {error}")
        # All-gather moves equal sizes: pad every rank's tokens to the largest shard.
        longest = max(s.num_tokens for s in ctx.shards)
        padded = x_local.new_zeros((1, longest, *trailing))
        padded[:, :x_local.shape[1]] = x_local
        gathered = exchange.all_gather(padded)
        out = x_local.new_empty((1, ctx.num_global_tokens, *trailing))
        for s, part in zip(ctx.shards, gathered):
            offset = 0
            for r in s.global_ranges:
                out[:, r.begin:r.end] = part[:, offset:offset + r.size]
                offset += r.size
        fctx.kcp_context = ctx
        return out

    @staticmethod
    def backward(fctx, grad: Tensor):
        return shard(grad, fctx.kcp_context), None, None


def unshard(x_local: Tensor, ctx: Context) -> Tensor:
    """The global packed tensor [1, T, ...] from every rank's [1, T_local, ...] (an all-gather
    through ctx's exchange; every rank must call it). The gradient of the result flows back to this
    rank's tokens (each rank is assumed to compute the same loss from the global tensor). Each
    call first agrees the context and x_local's dtype and trailing sizes on the host (one small
    all-gather and a host read: ranks that differ raise ValueError on every rank), so unlike the
    ops it cannot be captured in a CUDA graph."""
    error = _packed_error(x_local, "x_local", ctx.num_tokens,
                          f"rank {ctx.rank}'s local token count")
    return _Unshard.apply(x_local, ctx, error)


_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)
