"""GDN and KDA under context parallelism: each rank walks its shard; the states that cross ranks
are passed exactly through affine summaries (docs/design/context-parallel.md).

Forward on one rank, with P segments per fragment (the call plan, cake.kcp.plan):
  1. the summary walk: for every segment of a fragment that is cut (S > 1), crosses out
     (state_out) or, when gradients are wanted, crosses in (state_in), its map (M, B): the
     single-rank forward over those segments from S_in = 0 (final states: B) and with v = 0 of
     V' = K columns from S_in = I (final states: M), so that the op's transforms (L2 norm, gate,
     beta sigmoid) are those of the final walk;
  2. one all-gather of the call's header and one record per state_out fragment (its segments
     composed; a document's first piece has its initial state folded in: B <- M h0 + B); the
     first call of its sizes on the exchange agrees them on the host before (cake.kcp.check);
  3. every state_in fragment's S_in by composing its document's earlier pieces in order, and every
     segment's S_in along its fragment (batched scans, one product per step);
  4. o and the final states. The walk is affine in S_in: a summarised segment's o is
     o_0 + O_M S_in per value head, o_0 the output of the walk from S_in = 0 and O_M [T_s, K] the
     output of the walk from S_in = I with v = 0 (both from step 1), and its S_out is M S_in + B;
     the other segments are walked once more, from their true S_in (one single-rank forward).
Backward, the mirror image with adjoint records (M^T, C): C is the gradient reaching a segment's
S_in from its own outputs, O_M^T dout by the same linearity (what a backward with dht = 0 would
give as dh0); records of state_in fragments are all-gathered (a document's last piece has its dht
folded in: C <- C + M^T dht), composed in reverse piece order into every state_out fragment's
dS_out, then along the segments; one single-rank backward over the shard with the saved S_in and
dht = dS_out gives every gradient.
After the first call of a context and of its sizes, a call reads nothing from the device.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .. import abi, gate
from .. import ops as single
from ..options import CHUNK_SIZE, GATED_DELTA_RULE, KDA_OP, RECOMPUTE_ORDERED, Op, parse
from . import check, summary
from .context import OP_HEADER_FIELDS, Context, _dtype_code
from .exchange import float_bits

# The bits of the header's "flags" field, lowest first.
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
    state_v_first: bool
    needs_grad: bool

    def op_options(self) -> tuple:
        """The options in the order of the single-rank custom ops, after their scale."""
        return (self.use_qk_l2norm, self.use_gate_in_kernel, self.lower_bound,
                self.use_beta_sigmoid, self.allow_neg_eigval)


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
        if h0.device != q.device:
            return f"initial_state must be on q's device ({q.device}), got {h0.device}"
        # h0 is [N, HV, K, V] here; the message shows the caller's layout.
        expected, got, dims = (ctx.num_documents, HV, K, V), tuple(h0.shape), "K, V"
        if got != expected and opts.state_v_first:
            expected, got, dims = (ctx.num_documents, HV, V, K), got[:-2] + got[:-3:-1], "V, K"
        if got != expected:
            return (f"initial_state must be [N, HV, {dims}] = {list(expected)} (one state per "
                    f"global document of the context), got {list(got)}")
    return None


def _validate_walk(exchange, opts: _Options, plan, tensors, sd) -> None:
    """The single-rank validation of the final walk's arguments (raises its ValueError), once per
    set of argument shapes, strides, dtypes and devices on this rank (the validation reads
    nothing else, so a set that passed once passes again)."""
    q, k, v, g, beta, _, A_log, dt_bias = tensors
    key = (opts, plan.num_segments, check.CallState.argument_key(tensors))
    state = check.state_of(exchange)
    if key in state.validated or not plan.num_segments:
        return
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    o = q.new_empty(q.shape[:2] + v.shape[2:])
    final = torch.empty(plan.num_segments, HV, K, V, dtype=sd, device=q.device)
    abi.forward_workspace_size(q, k, v, g, beta, final, plan.shard.offsets, A_log, dt_bias, o,
                              final, opts.variant, opts.scale, *opts.op_options(),
                              *RECOMPUTE_ORDERED)
    state.remember_validated(key)


def _walk(opts: _Options, q, k, v, g, beta, h0, cu: Tensor, A_log, dt_bias):
    """The single-rank forward over a packed problem of offsets cu: (o, final states
    [S, HV, K, V']).

    Recompute mode: the context-parallel backward runs its own single-rank backward walks.
    """
    o, final, _ = single._forward(opts.variant, q, k, v, g, beta, h0, cu, A_log, dt_bias,
                                  opts.scale, True, *opts.op_options(), *RECOMPUTE_ORDERED)
    return o, final


def _walk_backward(opts: _Options, q, k, v, g, beta, h0, cu: Tensor, A_log, dt_bias, dout,
                   dht):
    """The single-rank backward: dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias."""
    return single._backward(opts.variant, q, k, v, g, beta, h0, cu, A_log, dt_bias,
                            dout.contiguous(), None if dht is None else dht.contiguous(),
                            opts.scale, *opts.op_options(), *RECOMPUTE_ORDERED, None)


def _phase(name: str):
    """A profiler range around one phase of a call: torch.profiler shows the phase's kernels under
    "cake.kcp.<name>" (bench/bench_kcp_one_gpu.py reports each phase's share)."""
    return torch.profiler.record_function(f"cake.kcp.{name}")


def _segment_summaries(opts: _Options, walk, q, k, v, g, beta, A_log, dt_bias, sd):
    """The walk's segments (R of them, T_R tokens, in its order) from S_in = 0 with v, and from
    S_in = I with v = 0 of V' = K columns (rather than one walk of V + K columns: the kernels
    bound V): o_0 [1, T_R, HV, V], B [R, HV, K, V], O_M [1, T_R, HV, K], M [R, HV, K, K]."""
    HV, K = v.shape[2], q.shape[3]
    with _phase("summary_walks"):
        q, k, v, g, beta = (walk.take(x) for x in (q, k, v, g, beta))
        o_0, b = _walk(opts, q, k, v, g, beta, None, walk.offsets, A_log, dt_bias)
        identity = torch.eye(K, dtype=sd, device=q.device).expand(len(walk.segments), HV, K, K)
        o_m, m = _walk(opts, q, k, v.new_zeros(v.shape[:3] + (K,)), g, beta,
                       identity.contiguous(), walk.offsets, A_log, dt_bias)
    return o_0, b, o_m, m


def _gather_heads(x: Tensor, rows: Tensor) -> Tensor:
    """x [1, T, HV, X] at rows [n, L] (a plan.SpanBatch's), value heads first: [HV * n, L, X],
    one batched product's operand per (value head, span), in one gathering pass."""
    HV, n, L = x.shape[2], rows.shape[0], rows.shape[1]
    return x[0].transpose(0, 1).index_select(1, rows.flatten()).view(HV * n, L, x.shape[3])


def _heads_first(s: Tensor) -> Tensor:
    """Per-span states [n, HV, K, X] in _gather_heads' order: [HV * n, K, X]."""
    return s.transpose(0, 1).reshape(-1, s.shape[2], s.shape[3])


def _run_of(x: Tensor, start: int, length: int) -> Tensor:
    """Rows start .. start + length of x [1, T, HV, X], value heads first: [HV, length, X], a
    strided view (a batched product's operand or output as it is, no copy)."""
    return x[0, start:start + length].transpose(0, 1)


def _summarised_outputs(plan, o: Tensor, o_0: Tensor, o_m: Tensor, seg_in: Tensor) -> None:
    """o [1, T_local + 1, HV, V] of the summarised segments, o_0 + O_M S_in, with o_0 as the
    products' addend: a long span's product written into o's rows in place, one batched product
    per batch of short spans (plan.SpanBatch), its padding rows scattered to row T_local. In o's
    dtype (bf16 on the GPU: tensor cores, S_in rounded to bf16 as the walk's own tensor-core
    products round its state), the product and the addend summed in fp32 and rounded once."""
    HV, V = o.shape[2], o.shape[3]
    with _phase("outputs"):
        s_in = seg_in.to(o.dtype)
        for span in plan.summary_spans.runs:
            torch.baddbmm(_run_of(o_0, span.row, span.length), _run_of(o_m, span.row, span.length),
                          s_in[span.item], out=_run_of(o, span.token, span.length))
        o_by_head = o[0].transpose(0, 1)  # [HV, T_local + 1, V], the products' row order
        for batch in plan.summary_spans.batches:
            o_s = torch.baddbmm(_gather_heads(o_0, batch.rows), _gather_heads(o_m, batch.rows),
                                _heads_first(s_in.index_select(0, batch.items)))
            o_by_head[:, batch.out_tokens] = o_s.view(HV, -1, V)


def _adjoint_c(plan, o_m: Tensor, d_o: Tensor, sd: torch.dtype) -> Tensor:
    """C [R', HV, K, V] of the adjoint rows: O_M^T dout over each one's tokens (in dout's
    dtype, as the products above), a long span's product on views of its rows (no gathered
    copy), one batched product per batch of short spans; the padding rows' dout are zero, so
    that they add nothing (and a row without tokens keeps C = 0)."""
    HV, K, V = o_m.shape[2], o_m.shape[3], d_o.shape[3]
    c = torch.zeros(plan.num_adjoints, HV, K, V, dtype=sd, device=o_m.device)
    with _phase("adjoint_products"):
        d_o = d_o.to(o_m.dtype)
        for span in plan.adjoint_spans.runs:
            c[span.item] = torch.bmm(_run_of(o_m, span.row, span.length).transpose(1, 2),
                                     _run_of(d_o, span.token, span.length))
        for batch in plan.adjoint_spans.batches:
            n, L = batch.rows.shape
            d_o_rows = _gather_heads(d_o, batch.tokens)
            d_o_rows.view(HV, n * L, V).index_fill_(1, batch.padding_at, 0)
            c_s = torch.bmm(_gather_heads(o_m, batch.rows).transpose(1, 2), d_o_rows)
            c[batch.items] = c_s.view(HV, n, K, V).transpose(0, 1).to(sd)
    return c


def _rows_of(records: Tensor, K: int):
    """maps(columns) over records [R, HV, K, K + V]: the rows in columns[0]."""
    return lambda columns: (records[columns[0], ..., :K], records[columns[0], ..., K:])


def _header(ctx: Context, opts: _Options, q, v, h0, A_log, dt_bias, HV, K, V, slots) -> dict:
    flags = dict(use_qk_l2norm=opts.use_qk_l2norm, use_gate_in_kernel=opts.use_gate_in_kernel,
                 use_beta_sigmoid=opts.use_beta_sigmoid, allow_neg_eigval=opts.allow_neg_eigval,
                 output_final_state=opts.output_final_state, initial_state=h0 is not None,
                 A_log=A_log is not None, dt_bias=dt_bias is not None)
    header = {"context": ctx.fingerprint, "variant": opts.variant,
              "num_heads": q.shape[2] if q.dim() == 4 else -1, "num_v_heads": HV,
              "head_dim_k": K, "head_dim_v": V, "dtype": _dtype_code(q.dtype),
              "device_type": 1 if q.is_cuda else 0, "scale": float_bits(opts.scale),
              "flags": sum(int(flags[n]) << i for i, n in enumerate(_FLAG_NAMES)),
              "lower_bound": float_bits(opts.lower_bound) if opts.lower_bound is not None
              else -1,
              "forward_slots": slots, "needs_grad": int(opts.needs_grad)}
    assert tuple(header) == OP_HEADER_FIELDS
    return header


_FLOATS = ("scale", "lower_bound")


class _KCPFunction(torch.autograd.Function):
    @staticmethod
    def forward(fctx, ctx: Context, opts: _Options, error: Optional[str], q, k, v, g, beta, h0,
                A_log, dt_bias):
        exchange = ctx.require_exchange(opts.name)
        tensors = (q, k, v, g, beta, h0, A_log, dt_bias)
        sd = _state_dtype(q)
        HV = v.shape[2] if v.dim() == 4 else 1
        K = q.shape[3] if q.dim() == 4 else 1
        V = v.shape[3] if v.dim() == 4 else 1
        slots = ctx.exchange_bytes(HV, K, V)
        failure = plan = None
        if error is None:
            error = _input_error(ctx, opts, *tensors[:6])
        if error is None:
            try:
                plan = ctx.call_plan(ctx.segments_for(HV), h0 is not None, opts.needs_grad,
                                     q.device)
                _validate_walk(exchange, opts, plan, tensors, sd)
            except Exception as e:  # noqa: BLE001 - reported to every rank, then re-raised here
                failure, error = e, str(e)
        fields = _header(ctx, opts, q, v, h0, A_log, dt_bias, HV, K, V, slots.forward_slots)
        sizes = (HV, K, V, sd, q.device.type, opts.needs_grad)
        try:
            check.agree_sizes(exchange, opts.name, sizes, fields,
                              error and f"{opts.name}: {error}", _FLOATS)
        except ValueError:
            if failure is not None:
                raise failure
            raise

        # Every segment record the forward needs, then the state_out fragments' records (their
        # segments composed, the initial state folded into a first piece's), sent at their slots.
        # A rank that rejected its arguments sends zeros and its flag, then raises.
        if error is not None:
            plan = None
        m_all = b_all = o_0 = o_m = sent = None
        if plan is not None and plan.summaries is not None:
            o_0, b_all, o_m, m_all = _segment_summaries(opts, plan.summaries, q, k, v, g, beta,
                                                        A_log, dt_bias, sd)
        if slots.forward_slots:
            sent = torch.zeros(slots.forward_slots, HV, K, K + V, dtype=sd, device=q.device)
            if plan is not None and plan.out_records is not None:
                m, b = summary.scan_compose(
                    plan.out_records, lambda c: (m_all[c[0]], b_all[c[0]]))
                if plan.out_first_pieces is not None:
                    at, documents = plan.out_first_pieces
                    b[at] = m[at] @ h0.index_select(0, documents).to(sd) + b[at]
                sent[plan.out_slots] = torch.cat([m, b], dim=-1)
        message = exchange.all_gather(check.pack(ctx.call_header(fields, error is None, q.device),
                                                 sent))
        if error is not None:
            check.reject(exchange, opts.name, fields, message)
            raise failure if failure is not None else ValueError(f"{opts.name}: {error}")
        headers, gathered = check.unpack(message, fields, sd, (HV, K, K + V))
        bad = check.verdict(exchange, opts.name, fields, headers, _FLOATS)

        # S_in of every fragment (through its document's earlier pieces, or its initial state),
        # then of every segment along its fragment: [S, HV, K, V].
        F, S = len(ctx.fragments), plan.num_segments
        fragment_in = torch.zeros(F, HV, K, V, dtype=sd, device=q.device)
        if plan.own_fragments is not None:
            fragment_in[plan.own_fragments] = h0.index_select(0, plan.own_documents).to(sd)
        if plan.in_chain is not None:
            zero = torch.zeros(plan.in_fragments.numel(), HV, K, V, dtype=sd, device=q.device)
            fragment_in[plan.in_fragments] = check.poison(
                summary.scan_apply(plan.in_chain, _rows_of(gathered, K), zero), bad)
        seg_in = torch.zeros(S, HV, K, V, dtype=sd, device=q.device)
        seg_in[plan.first_segments] = fragment_in
        if plan.along is not None:
            summary.scan_apply(plan.along, lambda c: (m_all[c[0]], b_all[c[0]]), fragment_in,
                               written=seg_in)

        # o and S_out of every segment: the summarised ones from their records and the summary
        # walks' outputs, the rest walked from their S_in.
        final_state = torch.zeros(ctx.num_documents, HV, K, V, dtype=sd, device=q.device)
        # Every token is in one of the two kinds; row T_local takes the products' padding rows.
        T_local = q.shape[1]
        o = q.new_empty((1, T_local + 1) + v.shape[2:])
        seg_out = torch.zeros(S, HV, K, V, dtype=sd, device=q.device)
        if plan.summaries is not None:
            rows = plan.summaries.segment_index
            _summarised_outputs(plan, o, o_0, o_m, seg_in)
            seg_out[rows] = m_all @ seg_in.index_select(0, rows) + b_all
        if plan.rest is not None:
            rest = plan.rest
            with _phase("walk"):
                o_rest, seg_out[rest.segment_index] = _walk(
                    opts, *(rest.take(x) for x in (q, k, v, g, beta)),
                    seg_in.index_select(0, rest.segment_index), rest.offsets, A_log, dt_bias)
            if rest.index is None:
                o = o_rest
            else:
                o[:, rest.index] = o_rest
        # Row T_local, the last in o's token-major memory, dropped in place: o keeps its storage
        # (no copy) and is no view, which a caller could not modify in place (autograd forbids
        # it on a custom Function's views).
        o.resize_((1, T_local) + v.shape[2:])
        if plan.last_segments is not None:
            final_state[plan.last_documents] = seg_out.index_select(0, plan.last_segments)
        if ctx.rank == 0 and h0 is not None:
            for n in ctx.empty_documents:
                final_state[n] = h0[n].to(sd)

        # O_M is kept for the adjoints' C only (O_M^T dout); a call without adjoints keeps none.
        fctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, seg_in, m_all,
                               o_m if plan.num_adjoints else None, bad)
        fctx.kcp = (ctx, opts, plan, h0 is not None, (HV, K, V), slots.backward_slots)
        fctx.set_materialize_grads(False)
        return o, final_state

    @staticmethod
    def backward(fctx, d_o, d_final):
        q, k, v, g, beta, A_log, dt_bias, seg_in, m_all, o_m, bad = fctx.saved_tensors
        ctx, opts, plan, has_h0, (HV, K, V), backward_slots = fctx.kcp
        sd, device = seg_in.dtype, q.device
        if d_o is None:
            d_o = q.new_zeros(q.shape[:2] + v.shape[2:])
        dht = d_final.to(sd) if (opts.output_final_state and d_final is not None) else None
        m_t = lambda rows: m_all[rows].transpose(-1, -2)  # noqa: E731 - M^T of summary rows

        # C of the segments of the fragments with state_in or cut: [R', HV, K, V].
        c_all = _adjoint_c(plan, o_m, d_o, sd) if plan.num_adjoints else None

        # The state_in fragments' adjoint records (their segments composed from the last back,
        # the final state's gradient folded into a document's last piece), sent at their slots.
        gathered = None
        if backward_slots:
            sent = torch.zeros(backward_slots, HV, K, K + V, dtype=sd, device=device)
            if plan.adjoint_records is not None:
                m, b = summary.scan_compose(plan.adjoint_records,
                                            lambda c: (m_t(c[1]), c_all[c[0]]))
                if plan.adjoint_last_pieces is not None and dht is not None:
                    at, documents = plan.adjoint_last_pieces
                    b[at] = m[at] @ dht.index_select(0, documents) + b[at]
                sent[plan.adjoint_slots] = torch.cat([m, b], dim=-1)
            gathered = torch.cat(ctx.exchange.all_gather(sent))

        # dS_out of every fragment (through its document's later pieces, or dht), then of every
        # segment back along its fragment: [S, HV, K, V].
        F, S = len(ctx.fragments), plan.num_segments
        fragment_out = torch.zeros(F, HV, K, V, dtype=sd, device=device)
        if dht is not None and plan.last_fragments is not None:
            fragment_out[plan.last_fragments] = dht.index_select(0, plan.last_documents)
        if plan.out_chain is not None:
            zero = torch.zeros(plan.out_fragments.numel(), HV, K, V, dtype=sd, device=device)
            fragment_out[plan.out_fragments] = check.poison(
                summary.scan_apply(plan.out_chain, _rows_of(gathered, K), zero), bad)
        seg_out = torch.zeros(S, HV, K, V, dtype=sd, device=device)
        seg_out[plan.last_segment_of] = fragment_out
        if plan.back_along is not None:
            summary.scan_apply(plan.back_along, lambda c: (m_t(c[1]), c_all[c[0]]),
                               fragment_out, written=seg_out)

        dh0 = torch.zeros(ctx.num_documents, HV, K, V, dtype=sd, device=device) \
            if has_h0 else None
        if S:
            with _phase("walk_backward"):
                dq, dk, dv, dg, dbeta, dseg_in, dA_log, ddt_bias = _walk_backward(
                    opts, q, k, v, g, beta, seg_in, plan.shard.offsets, A_log, dt_bias, d_o,
                    seg_out)
            if has_h0 and plan.own_fragments is not None:
                dh0[plan.own_documents] = dseg_in.index_select(
                    0, plan.first_segments.index_select(0, plan.own_fragments))
        else:
            dq, dk, dv, dg, dbeta = (torch.zeros_like(x) for x in (q, k, v, g, beta))
            dA_log = None if A_log is None else torch.zeros_like(A_log)
            ddt_bias = None if dt_bias is None else torch.zeros_like(dt_bias)
        if has_h0 and dht is not None and ctx.rank == 0:
            for n in ctx.empty_documents:
                dh0[n] = dht[n]
        return (None, None, None, dq, dk, dv, dg, dbeta, dh0,
                dA_log if A_log is not None else None, ddt_bias if dt_bias is not None else None)


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
    if initial_state is not None and not isinstance(initial_state, Tensor):
        errors.append(f"initial_state must be a torch.Tensor or None, got "
                      f"{type(initial_state).__name__}")
        initial_state = None
    if parsed.state_v_first and initial_state is not None and initial_state.dim() >= 2:
        initial_state = initial_state.transpose(-1, -2)  # [N, HV, V, K] -> [N, HV, K, V]
    q, k, v, g, beta, initial_state = (
        x.contiguous() if isinstance(x, Tensor) else x
        for x in (q, k, v, g, beta, initial_state))
    # The in-op gate and beta's sigmoid in torch first (gate.py): the summaries and the ranks'
    # calls read the activated g and beta; an error here is reported to every rank, below.
    if q.is_cuda and not errors and (parsed.use_gate_in_kernel or parsed.use_beta_sigmoid):
        try:
            parsed, g, beta, A_log, dt_bias = gate.in_torch(parsed, q, v, g, beta, A_log,
                                                            dt_bias)
        except ValueError as e:
            errors.append(str(e))
    tensors = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(x, Tensor) and x.requires_grad for x in tensors)
    opts = _Options(name, parsed.variant, float(scale), *parsed.flags(),
                    parsed.output_final_state, parsed.state_v_first, needs_grad)
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
