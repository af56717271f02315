"""GDN and KDA under context parallelism: each rank walks its shard; the states that cross ranks
are passed exactly through affine summaries (docs/design/context-parallel.md).

Forward on one rank, with P segments per fragment (segment_bounds):
  1. the summary walk: for every segment of a fragment that is cut (S > 1), crosses out
     (state_out) or, when gradients are wanted, crosses in (state_in), its record (M, B): the
     single-rank forward over those segments from S_in = 0 (final states: B) and with v = 0 of
     V' = K columns from S_in = I (final states: M), so that the op's transforms (L2 norm, gate,
     beta sigmoid) are those of the final walk;
  2. the header all-gather (shapes, options, record count), then the all-gather of one record per
     state_out fragment (its segments composed; a document's first piece has its initial state
     folded in: B <- M h0 + B);
  3. every state_in fragment's S_in by composing its document's earlier pieces in order, and every
     segment's S_in by composing along the fragment;
  4. one single-rank forward over the whole shard, each segment a sequence from its true S_in.
Backward, the mirror image with adjoint records (M^T, C): C is the gradient reaching a segment's
S_in from its own outputs (one single-rank backward with dht = 0); records of state_in fragments
are all-gathered (a document's last piece has its dht folded in: C <- C + M^T dht), composed in
reverse piece order into every state_out fragment's dS_out, then along the segments; one
single-rank backward over the shard with the saved S_in and dht = dS_out gives every gradient.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .. import abi
from .. import ops as single
from ..options import CHUNK_SIZE, GATED_DELTA_RULE, KDA_OP, Op, parse
from . import summary
from .context import OP_HEADER_FIELDS, Context, _dtype_code
from .exchange import agree, float_bits

_FLAG_NAMES = ("use_qk_l2norm", "use_gate_in_kernel", "use_beta_sigmoid", "allow_neg_eigval",
               "output_final_state", "initial_state", "A_log", "dt_bias")


@dataclass(frozen=True)
class _Options:
    name: str
    variant: int
    scale: float
    use_qk_l2norm: bool
    use_gate_in_kernel: bool
    lower_bound: Optional[float]
    use_beta_sigmoid: bool
    allow_neg_eigval: bool
    output_final_state: bool
    needs_grad: bool

    def op_options(self) -> tuple:
        """The options in the order of the single-rank custom ops, after their scale."""
        return (self.use_qk_l2norm, self.use_gate_in_kernel, self.lower_bound,
                self.use_beta_sigmoid, self.allow_neg_eigval)


@dataclass(frozen=True)
class _Segments:
    """The rank's fragments cut into segments: segment s holds local tokens [cu[s], cu[s + 1]);
    fragment i holds segments first[i] .. first[i] + count[i] - 1."""
    cu: tuple[int, ...]
    first: tuple[int, ...]
    count: tuple[int, ...]

    @property
    def num_segments(self) -> int:
        return len(self.cu) - 1

    def of(self, fragment: int) -> range:
        return range(self.first[fragment], self.first[fragment] + self.count[fragment])


def _segments(ctx: Context, P: int) -> _Segments:
    cu, first, count = [0], [], []
    for f in ctx.fragments:
        bounds = abi.kcp.segment_bounds(f.num_chunks, P)
        first.append(len(cu) - 1)
        count.append(len(bounds) - 1)
        begin = f.local_range.begin
        cu.extend(begin + min(b * CHUNK_SIZE, f.num_tokens) for b in bounds[1:])
    return _Segments(tuple(cu), tuple(first), tuple(count))


def _take(x: Optional[Tensor], ranges: list[tuple[int, int]]) -> Optional[Tensor]:
    """Tokens of x [1, T, ...] in the local ranges, concatenated: [1, sum of sizes, ...]."""
    if x is None:
        return None
    if len(ranges) == 1:
        return x[:, ranges[0][0]:ranges[0][1]]
    return torch.cat([x[:, a:b] for a, b in ranges], dim=1)


def _sub_problem(seg: _Segments, fragments: list[int]):
    """The token ranges and local cu_seqlens of the chosen fragments' segments walked as one
    packed problem, and the segment indices in that problem's order."""
    ranges, cu, order = [], [0], []
    for i in fragments:
        indices = list(seg.of(i))
        begin, end = seg.cu[indices[0]], seg.cu[indices[-1] + 1]
        ranges.append((begin, end))
        shift = cu[-1] - begin
        cu.extend(seg.cu[s + 1] + shift for s in indices)
        order.extend(indices)
    return ranges, cu, order


def _state_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _input_error(ctx: Context, opts: _Options, q, k, v, g, beta, h0) -> Optional[str]:
    """What is wrong with this rank's inputs as a shard of ctx (shapes against the context);
    the single-rank validation checks the rest."""
    T, r = ctx.num_tokens, ctx.rank
    shard = f"rank {r}'s shard of the context has T_local = {T} tokens"
    if q.dim() != 4 or q.shape[0] != 1 or q.shape[1] != T:
        return f"q must be [1, T_local, H, K] with T_local = {T} ({shard}), got {tuple(q.shape)}"
    if v.dim() != 4 or v.shape[0] != 1 or v.shape[1] != T:
        return f"v must be [1, T_local, HV, V] with T_local = {T} ({shard}), got {tuple(v.shape)}"
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    for name, x in (("k", k), ("g", g), ("beta", beta)):
        if x.dim() < 2 or x.shape[0] != 1 or x.shape[1] != T:
            return (f"{name} must be [1, T_local, ...] with T_local = {T} ({shard}), got "
                    f"{tuple(x.shape)}")
    if h0 is not None:
        expected = (ctx.num_documents, HV, K, V)
        if tuple(h0.shape) != expected:
            return (f"initial_state must be [N, HV, K, V] = {list(expected)} (one state per "
                    f"global document of the context), got {list(h0.shape)}")
    return None


def _validate_walk(opts: _Options, q, k, v, g, beta, A_log, dt_bias, cu: Tensor,
                   num_documents_state: Tensor) -> None:
    """Runs the single-rank validation on the final walk's arguments (raises its ValueError)."""
    o = q.new_empty(q.shape[:2] + v.shape[2:])
    final = num_documents_state.new_empty(num_documents_state.shape)
    abi.forward_workspace_size(q, k, v, g, beta, num_documents_state, cu, A_log, dt_bias, o, final,
                              opts.variant, opts.scale, *opts.op_options(), 0)


def _walk(opts: _Options, q, k, v, g, beta, h0, cu: Tensor, A_log, dt_bias):
    """The single-rank forward over a packed problem of offsets cu (Context.offsets): (o, final
    states [S, HV, K, V']).

    Recompute mode: the context-parallel backward runs its own single-rank backward walks.
    """
    o, final, _ = single._forward(opts.variant, q, k, v, g, beta, h0, cu, A_log, dt_bias,
                                  opts.scale, True, *opts.op_options(), 0)
    return o, final


def _walk_backward(opts: _Options, q, k, v, g, beta, h0, cu: Tensor, A_log, dt_bias, dout,
                   dht):
    """The single-rank backward: dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias."""
    return single._backward(opts.variant, q, k, v, g, beta, h0, cu, A_log, dt_bias,
                            dout.contiguous(), None if dht is None else dht.contiguous(),
                            opts.scale, *opts.op_options(), 0, None)  # recompute mode


def _segment_summaries(ctx: Context, opts: _Options, seg: _Segments, fragments: list[int], q, k,
                       v, g, beta, A_log, dt_bias, state_dtype) -> dict[int, Tensor]:
    """The records [HV, K, K + V] of every segment of the given fragments: {segment: record}.

    Two single-rank walks over those segments: B from S_in = 0 with v, and M from S_in = I with
    v = 0 of V' = K columns (rather than one walk of V + K columns: the kernels bound V).
    """
    if not fragments:
        return {}
    ranges, cu_list, order = _sub_problem(seg, fragments)
    cu = ctx.offsets(cu_list, q.device)
    HV, K = v.shape[2], q.shape[3]
    q_sub, k_sub, g_sub, beta_sub = (_take(x, ranges) for x in (q, k, g, beta))
    v_sub = _take(v, ranges)
    _, b = _walk(opts, q_sub, k_sub, v_sub, g_sub, beta_sub, None, cu, A_log, dt_bias)
    identity = torch.eye(K, dtype=state_dtype, device=q.device).expand(len(order), HV, K, K)
    _, m = _walk(opts, q_sub, k_sub, v_sub.new_zeros(v_sub.shape[:3] + (K,)), g_sub, beta_sub,
                 identity.contiguous(), cu, A_log, dt_bias)
    return {s: summary.make(m[j], b[j]) for j, s in enumerate(order)}


def _fragment_record(records: dict[int, Tensor], segments: range, K: int) -> Tensor:
    """The fragment's record: its segments' records composed in token order."""
    out = records[segments[0]]
    for s in segments[1:]:
        out = summary.compose(records[s], out, K)
    return out


class _KCPFunction(torch.autograd.Function):
    @staticmethod
    def forward(fctx, ctx: Context, opts: _Options, error: Optional[str], q, k, v, g, beta, h0,
                A_log, dt_bias):
        exchange = ctx.require_exchange(opts.name)
        failure = None
        seg = records = None
        sd = _state_dtype(q)
        if error is None:
            error = _input_error(ctx, opts, q, k, v, g, beta, h0)
        HV = v.shape[2] if v.dim() == 4 else 1
        K = q.shape[3] if q.dim() == 4 else 0
        V = v.shape[3] if v.dim() == 4 else 0
        if error is None:
            try:
                seg = _segments(ctx, ctx.segments_for(HV))
                if seg.num_segments:
                    _validate_walk(opts, q, k, v, g, beta, A_log, dt_bias,
                                   ctx.offsets(seg.cu, q.device),
                                   torch.empty(seg.num_segments, HV, K, V, dtype=sd,
                                               device=q.device))
                wanted = [i for i, f in enumerate(ctx.fragments)
                          if f.state_out or seg.count[i] > 1 or (f.state_in and opts.needs_grad)]
                records = _segment_summaries(ctx, opts, seg, wanted, q, k, v, g, beta, A_log,
                                             dt_bias, sd)
            except Exception as e:  # noqa: BLE001 - reported to every rank, then re-raised here
                failure = e
                error = str(e)
        plan = ctx.exchange_bytes(max(HV, 1), max(K, 1), max(V, 1))
        flags = (opts.use_qk_l2norm, opts.use_gate_in_kernel, opts.use_beta_sigmoid,
                 opts.allow_neg_eigval, opts.output_final_state, h0 is not None,
                 A_log is not None, dt_bias is not None)
        header = {"context": ctx.fingerprint, "variant": opts.variant,
                  "num_heads": q.shape[2] if q.dim() == 4 else -1, "num_v_heads": HV,
                  "head_dim_k": K, "head_dim_v": V, "dtype": _dtype_code(q.dtype),
                  "device_type": 1 if q.is_cuda else 0, "scale": float_bits(opts.scale),
                  "flags": sum(int(bool(x)) << i for i, x in enumerate(flags)),
                  "lower_bound": float_bits(opts.lower_bound) if opts.lower_bound is not None
                  else -1,
                  "forward_slots": plan.forward_slots, "needs_grad": int(opts.needs_grad)}
        assert tuple(header) == OP_HEADER_FIELDS
        try:
            agree(exchange, opts.name, header, error and f"{opts.name}: {error}",
                  float_fields=("scale", "lower_bound"))
        except ValueError:
            if failure is not None:
                raise failure
            raise

        # The forward records: one per state_out fragment at its summary_slot, [slots, HV, K, K+V].
        fragment_records = {i: _fragment_record(records, seg.of(i), K)
                            for i, f in enumerate(ctx.fragments) if f.state_out}
        gathered = None
        if plan.forward_slots:
            sent = torch.zeros(plan.forward_slots, HV, K, K + V, dtype=sd, device=q.device)
            for i, record in fragment_records.items():
                f = ctx.fragments[i]
                if f.piece == 0 and h0 is not None:
                    record = summary.make(summary.linear(record, K),
                                          summary.apply(record, h0[f.document].to(sd), K))
                sent[f.summary_slot] = record
            gathered = exchange.all_gather(sent)

        # S_in of every fragment, then of every segment: [num_segments, HV, K, V].
        seg_in = torch.zeros(seg.num_segments, HV, K, V, dtype=sd, device=q.device)
        for i, f in enumerate(ctx.fragments):
            if f.state_in:
                state = summary.chain(_chain_records(ctx, gathered, f, "previous"),
                                      torch.zeros(HV, K, V, dtype=sd, device=q.device), K)
            elif h0 is not None:
                state = h0[f.document].to(sd)
            else:
                state = torch.zeros(HV, K, V, dtype=sd, device=q.device)
            for s in seg.of(i):
                seg_in[s] = state
                if s + 1 < seg.first[i] + seg.count[i]:
                    state = summary.apply(records[s], state, K)

        final_state = torch.zeros(ctx.num_documents, HV, K, V, dtype=sd, device=q.device)
        if seg.num_segments:
            o, seg_out = _walk(opts, q, k, v, g, beta, seg_in, ctx.offsets(seg.cu, q.device),
                               A_log, dt_bias)
            for i, f in enumerate(ctx.fragments):
                if not f.state_out:
                    final_state[f.document] = seg_out[seg.first[i] + seg.count[i] - 1]
        else:
            o = q.new_zeros(q.shape[:2] + v.shape[2:])
        if ctx.rank == 0:
            for n in ctx.empty_documents:
                if h0 is not None:
                    final_state[n] = h0[n].to(sd)

        fctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, seg_in)
        fctx.kcp = (ctx, opts, seg, {s: summary.linear(r, K) for s, r in records.items()},
                    h0 is not None, (HV, K, V), plan.backward_slots)
        fctx.set_materialize_grads(False)
        return o, final_state

    @staticmethod
    def backward(fctx, d_o, d_final):
        q, k, v, g, beta, A_log, dt_bias, seg_in = fctx.saved_tensors
        ctx, opts, seg, linears, has_h0, (HV, K, V), backward_slots = fctx.kcp
        sd = seg_in.dtype
        zeros = lambda: torch.zeros(HV, K, V, dtype=sd, device=q.device)  # noqa: E731
        if d_o is None:
            d_o = q.new_zeros(q.shape[:2] + v.shape[2:])
        dht = d_final.to(sd) if (opts.output_final_state and d_final is not None) else None

        # C of every segment of the fragments with state_in or cut: {segment: [HV, K, V]}.
        wanted = [i for i, f in enumerate(ctx.fragments) if f.state_in or seg.count[i] > 1]
        own: dict[int, Tensor] = {}
        if wanted:
            ranges, cu, order = _sub_problem(seg, wanted)
            grads = _walk_backward(opts, _take(q, ranges), _take(k, ranges), _take(v, ranges),
                                   _take(g, ranges), _take(beta, ranges), seg_in[order],
                                   ctx.offsets(cu, q.device), A_log, dt_bias,
                                   _take(d_o, ranges), None)
            own = {s: grads[5][j] for j, s in enumerate(order)}

        # The backward records: one per state_in fragment at its adjoint_slot, [slots, HV, K, K+V].
        gathered = None
        if backward_slots:
            sent = torch.zeros(backward_slots, HV, K, K + V, dtype=sd, device=q.device)
            for i, f in enumerate(ctx.fragments):
                if not f.state_in:
                    continue
                indices = list(seg.of(i))
                record = summary.adjoint(linears[indices[-1]], own[indices[-1]])
                for s in reversed(indices[:-1]):
                    record = summary.compose(summary.adjoint(linears[s], own[s]), record, K)
                if not f.state_out and dht is not None:
                    record = summary.make(summary.linear(record, K),
                                          summary.apply(record, dht[f.document], K))
                sent[f.adjoint_slot] = record
            gathered = ctx.exchange.all_gather(sent)

        # dS_out of every fragment, then of every segment: [num_segments, HV, K, V].
        seg_out = torch.zeros(seg.num_segments, HV, K, V, dtype=sd, device=q.device)
        for i, f in enumerate(ctx.fragments):
            if f.state_out:
                state = summary.chain(_chain_records(ctx, gathered, f, "next"), zeros(), K)
            elif dht is not None:
                state = dht[f.document]
            else:
                state = zeros()
            indices = list(seg.of(i))
            for s in reversed(indices):
                seg_out[s] = state
                if s != indices[0]:
                    state = linears[s].transpose(-1, -2) @ state + own[s]

        n_docs = ctx.num_documents
        dh0 = torch.zeros(n_docs, HV, K, V, dtype=sd, device=q.device) if has_h0 else None
        if seg.num_segments:
            dq, dk, dv, dg, dbeta, dseg_in, dA_log, ddt_bias = _walk_backward(
                opts, q, k, v, g, beta, seg_in, ctx.offsets(seg.cu, q.device), A_log, dt_bias, d_o,
                seg_out)
            if has_h0:
                for i, f in enumerate(ctx.fragments):
                    if not f.state_in:
                        dh0[f.document] = dseg_in[seg.first[i]]
        else:
            dq, dk, dv, dg, dbeta = (torch.zeros_like(x) for x in (q, k, v, g, beta))
            dA_log = None if A_log is None else torch.zeros_like(A_log)
            ddt_bias = None if dt_bias is None else torch.zeros_like(dt_bias)
        if has_h0 and dht is not None and ctx.rank == 0:
            for n in ctx.empty_documents:
                dh0[n] = dht[n]
        return (None, None, None, dq, dk, dv, dg, dbeta, dh0,
                dA_log if A_log is not None else None, ddt_bias if dt_bias is not None else None)


def _chain_records(ctx: Context, gathered: list[Tensor], f, direction: str) -> list[Tensor]:
    """The records of the pieces before ("previous": forward records, first piece first) or after
    ("next": adjoint records, last piece first) fragment f, in the order they are applied."""
    out = []
    ref = getattr(f, direction)
    while ref is not None:
        other = ctx.shards[ref.rank].fragments[ref.index]
        slot = other.summary_slot if direction == "previous" else other.adjoint_slot
        out.append(gathered[ref.rank][slot])
        ref = getattr(other, direction)
    out.reverse()
    return out


def _run(op: Op, q, k, v, g, beta, ctx, initial_state, A_log, dt_bias, not_from_caller: dict,
         **options):
    """The shared body: parses the options as the single-rank op does (options.parse), adds the
    errors of arguments the context gives, and runs the forward with every rank agreeing on them.
    """
    name = f"{op.name}_kcp"
    if not isinstance(ctx, Context):
        raise TypeError(f"{name}: ctx must be a cake.kcp.Context (build_context), got "
                        f"{type(ctx).__name__}")
    for arg, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(x).__name__}")
    parsed, A_log, dt_bias, errors = parse(op, A_log=A_log, dt_bias=dt_bias,
                                           **single.head_counts(q, v), stacklevel=4, **options)
    errors += [f"{key} must be None: the context gives each rank its local cu_seqlens"
               for key, value in not_from_caller.items() if value is not None]
    if parsed.return_intermediate_states:
        errors.append("return_intermediate_states is not supported by cake.kcp")
    scale = single.default_scale(q) if parsed.scale is None else parsed.scale
    if parsed.state_v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2)  # [N, HV, V, K] -> [N, HV, K, V]
    q, k, v, g, beta, initial_state = (
        x.contiguous() if isinstance(x, Tensor) else x
        for x in (q, k, v, g, beta, initial_state))
    tensors = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(x, Tensor) and x.requires_grad for x in tensors)
    opts = _Options(name, parsed.variant, float(scale), *parsed.flags(),
                    parsed.output_final_state, needs_grad)
    error = "; ".join(errors) if errors else None
    o, final_state = _KCPFunction.apply(ctx, opts, error, *tensors)
    if not parsed.output_final_state:
        return o, None
    return o, final_state.transpose(-1, -2).contiguous() if parsed.state_v_first else final_state


def chunk_gated_delta_rule_kcp(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ctx: Context,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    chunk_size: int = CHUNK_SIZE,
    transpose_state_layout: Optional[bool] = None,
    head_first: Optional[bool] = None,
    cu_seqlens: None = None,
    cu_seqlens_cpu: None = None,
    chunk_indices: None = None,
    cp_context: None = None,
):
    """cake.chunk_gated_delta_rule on this rank's shard of a context-parallel batch; every rank of
    ctx must call it (and later run its backward) with the same shapes and options.

    Args:
        q, k: ``[1, T_local, H, K]``; v: ``[1, T_local, HV, V]``; g, beta: ``[1, T_local, HV]``:
            this rank's tokens (``cake.kcp.shard`` of the global tensors).
        ctx: the rank's context (``cake.kcp.build_context``).
        initial_state: ``[N, HV, K, V]`` per *global* document, the same tensor on every rank; a
            document's state enters at its first piece.
        output_final_state: return ``[N, HV, K, V]`` with the rows of the documents whose last
            piece is on this rank filled (on rank 0 also the empty documents) and the other rows
            zero (``ctx.final_documents`` lists the filled rows). Summed over ranks it is the
            single-rank final state.
        The other options as ``cake.chunk_gated_delta_rule``; ``cu_seqlens``,
        ``cu_seqlens_cpu``, ``chunk_indices`` and ``cp_context`` come from ctx (None only).

    Returns:
        ``(o [1, T_local, HV, V], final_state or None)``. Gradients of q, k, v, g, beta are this
        rank's tokens' gradients; those of initial_state, A_log and dt_bias are this rank's partial
        sums (summed over ranks they are the single-rank gradients).
    """
    return _run(GATED_DELTA_RULE, q, k, v, g, beta, ctx, initial_state, A_log, dt_bias,
                dict(cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                     chunk_indices=chunk_indices, cp_context=cp_context),
                scale=scale, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                use_gate_in_kernel=use_gate_in_kernel,
                use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                transpose_state_layout=transpose_state_layout, chunk_size=chunk_size,
                head_first=head_first)


def chunk_kda_kcp(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ctx: Context,
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
    *,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    chunk_size: int = CHUNK_SIZE,
    transpose_state_layout: Optional[bool] = None,
    head_first: Optional[bool] = None,
    cu_seqlens: None = None,
    cu_seqlens_cpu: None = None,
    cp_context: None = None,
):
    """cake.chunk_kda on this rank's shard of a context-parallel batch: g is ``[1, T_local, HV,
    K]``; everything else as chunk_gated_delta_rule_kcp and cake.chunk_kda
    (``return_intermediate_states`` is not supported here)."""
    return _run(KDA_OP, q, k, v, g, beta, ctx, initial_state, A_log, dt_bias,
                dict(cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, cp_context=cp_context),
                scale=scale, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                use_gate_in_kernel=use_gate_in_kernel,
                use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                disable_recompute=disable_recompute,
                return_intermediate_states=return_intermediate_states,
                state_v_first=state_v_first, transpose_state_layout=transpose_state_layout,
                chunk_size=chunk_size, head_first=head_first)
