"""Context parallelism measured on one GPU: every rank's share of a KCP pack timed on its own,
against the single-GPU time of the whole pack over W (parallel efficiency), and against the same
ranks without segments; plus the exact intra-GPU segments of one long document (W = 1).

    python bench/bench_kcp_one_gpu.py --packs P1 P2 P3 P4 P5 --worlds 2 4 8 --out kcp1.jsonl
    python bench/bench_kcp_one_gpu.py --packs D256K --worlds 1 --segments 0 1 2 4 8
    python bench/bench_kcp_one_gpu.py --packs A G M --worlds 1 --segments 0 1 2 4
    python bench/bench_kcp_one_gpu.py --device cpu          # a smoke run of the harness (FP64)

How one rank runs alone: W virtual ranks (cake.kcp.VirtualWorld, one thread each) run one step
together while each rank records what its all-gathers returned; each rank's step is then replayed
alone on the GPU with an exchange that answers from that record (checked first to give the
recorded outputs bitwise). A rank's time is thus its summaries, compositions and walks, without
the exchange: the exchange is reported as the bytes each rank sends and receives
(ctx.exchange_bytes); its time across GPUs belongs to the multi-GPU benchmark (bench_kcp.py).

Timing (bench/workloads.json "timing_protocol", as bench_gdn.py): CUDA events, the L2 flushed and
the device idle before every timed call; one untimed call per arm, then groups visiting the arms
in palindromic order; a cell is the median over groups of each group's median; a control arm
(rank 0 again) measures noise. Arms of a cell: every rank's KCP step ("rank<r>"), every rank's
local walk alone ("local<r>": the single-rank op over the rank's shard, no state passing, no
segments), the whole pack on the single-GPU op ("single"), and the control. One JSON line per
(pack, W, layout, segments, op): the slowest rank, every rank's time, P, overhead (rank - local),
peak extra memory, efficiency = single / (W x slowest rank), exchange bytes, the control ratio,
o's relative RMS against the single-GPU op over each rank's tokens (worst rank), and the slowest
rank's kernel time by phase of the call (cake.kcp's profiler ranges: the summary walks, the
outputs' and adjoints' products, the walk of the rest, the backward's walk; "other" the
compositions and copies; one profiled step, L2 not flushed: shares, not times). With
--batched-arm, every rank's step again with all of its spans' products gathered into batches
(cake.kcp.plan.LONG_SPAN_ROWS out of reach) as arms "batched<r>" of the same groups: the in-place
products of long spans against the gathered ones (batched_rank_ms, batched_slowest_rank_ms;
o_rel_rms_batched_vs_in_place: the two forms' o, worst rank).

Packs: bench/workloads.json "gdn" "context_parallel" (P1-P5), its single-GPU workloads A, G and M
(all three at 16/48 heads; with --worlds 1 they say what segments do to a single-GPU call), and
D256K: one document of 262,144 tokens. Heads: 16 q/k and 48 value heads (--heads H HV), K = V =
128, inputs as bench_gdn.py (bf16 q, k, v; fp32 g, beta; the q/k L2 norm in the kernel); KDA
(--variant kda) with g per channel in (-5, 0) as bench_kda.py. --segments: 0 the plan rule,
1..16 forced.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gdn import git_commit, measure, peak_bytes, rel_rms, time_once  # noqa: E402
from kernel_times import phase_times, summary  # noqa: E402

HERE = Path(__file__).resolve().parent
PACK_D256K = [262144]


class Recorder:
    """Wraps a rank's exchange and keeps what every all-gather returned, in order."""

    def __init__(self, inner):
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.log = []

    def all_gather(self, tensor):
        out = self.inner.all_gather(tensor)
        self.log.append(out)
        return out


class Replay:
    """A rank's exchange answering from a recorded step: the i-th all-gather of a step gets the
    i-th recorded answer (its shape checked), so the rank runs without the others."""

    def __init__(self, recorder):
        self.rank, self.world_size = recorder.rank, recorder.world_size
        self.log, self.calls = recorder.log, 0
        self._kcp_calls = recorder._kcp_calls  # the sizes agreed while recording

    def all_gather(self, tensor):
        out = self.log[self.calls % len(self.log)]
        self.calls += 1
        if out[0].shape != tensor.shape or out[0].dtype != tensor.dtype:
            raise RuntimeError(f"replay: recorded {tuple(out[0].shape)} {out[0].dtype}, asked "
                               f"{tuple(tensor.shape)} {tensor.dtype}")
        return out


def make_inputs(T, H, HV, kda, device, dtype, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    kw = dict(device=device, generator=gen)
    low = dtype if dtype == torch.float64 else torch.bfloat16
    state = torch.float64 if dtype == torch.float64 else torch.float32
    K = V = 128 if device.type == "cuda" else 16
    q = torch.randn(1, T, H, K, dtype=low, **kw)
    k = torch.randn(1, T, H, K, dtype=low, **kw)
    v = torch.randn(1, T, HV, V, dtype=low, **kw)
    if kda:
        g = -5.0 * torch.rand(1, T, HV, K, dtype=state, **kw)
    else:
        g = F.logsigmoid(torch.randn(1, T, HV, dtype=state, **kw))
    beta = torch.rand(1, T, HV, dtype=state, **kw)
    do = torch.randn(1, T, HV, V, dtype=low, **kw)
    return [q, k, v, g, beta], do


def rank_step(fn, op, ctx, local, do_local):
    """One rank's KCP call (and its backward) on its local leaves; returns o."""
    o, _ = fn(*local, ctx, use_qk_l2norm_in_kernel=True)
    if op == "fwd+bwd":
        o.backward(do_local)
    for t in local:
        t.grad = None
    return o.detach()


def record(kcp, fn, op, cu, inputs, do, W, layout, segments):
    """Runs one step on W virtual ranks after a warm-up step; returns per rank (ctx, recorder,
    local leaves, local do, o of the recorded step)."""

    def body(ex):
        recorder = Recorder(ex)
        ctx = kcp.build_context(cu, exchange=recorder, layout=layout, segments=segments or None)
        local = [kcp.shard(x, ctx).detach().requires_grad_(x.is_floating_point())
                 for x in inputs]
        do_local = kcp.shard(do, ctx)
        rank_step(fn, op, ctx, local, do_local)  # agrees the sizes, builds the call plan
        recorder.log.clear()
        o = rank_step(fn, op, ctx, local, do_local)
        kcp.check_calls(ctx)
        return ctx, recorder, local, do_local, o

    return kcp.VirtualWorld(W, timeout=600.0).run(body)


def time_on_host(run, l2):
    start = time.perf_counter()
    run()
    return 1e3 * (time.perf_counter() - start)


def replayed_steps(fn, op, ranks, name):
    """Each recorded rank's step, replaying its exchange (checked to give the recorded o
    bitwise), as arms "<name><rank>"."""
    steps = {}
    for ctx, recorder, local, do_local, o in ranks:
        ctx.exchange = Replay(recorder)
        replayed = rank_step(fn, op, ctx, local, do_local)
        if not torch.equal(replayed, o):
            raise RuntimeError(f"rank {ctx.rank}: the replayed step differs from the recorded one")
        steps[f"{name}{ctx.rank}"] = (lambda c=ctx, x=local, d=do_local:
                                      rank_step(fn, op, c, x, d))
    return steps


def record_batched(kcp, fn, op, cu, inputs, do, W, layout, segments):
    """record() with every span's products gathered into batches: the call plans, built by the
    recording's first step and kept by each context, see no span as long."""
    from cake.kcp import plan
    default, plan.LONG_SPAN_ROWS = plan.LONG_SPAN_ROWS, 1 << 62
    try:
        return record(kcp, fn, op, cu, inputs, do, W, layout, segments)
    finally:
        plan.LONG_SPAN_ROWS = default


def bench_cell(args, cake, kcp, fn, single_fn, pack, W, layout, segments, op, inputs, do, cu,
               device, meta, out):
    ranks = record(kcp, fn, op, cu, inputs, do, W, layout, segments)
    steps = replayed_steps(fn, op, ranks, "rank")
    batched_ranks = record_batched(kcp, fn, op, cu, inputs, do, W, layout, segments) \
        if args.batched_arm else []
    batched = replayed_steps(fn, op, batched_ranks, "batched")
    local_steps = {}
    for ctx, _, local, do_local, _ in ranks:
        local_steps[f"local{ctx.rank}"] = (lambda c=ctx, x=local, d=do_local:
                                           _local_step(single_fn, op, c, x, d))
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    # Each rank's recorded o against the single-GPU op's o over the rank's tokens: the ranks must
    # compute the whole pack's result for their times to count (rel-RMS, worst rank).
    with torch.no_grad():
        o_single = single_fn(*leaves, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)[0]
    agreement = max(rel_rms(o, kcp.shard(o_single, ctx)) for ctx, _, _, _, o in ranks)
    del o_single

    def single():
        o, _ = single_fn(*leaves, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
        if op == "fwd+bwd":
            o.backward(do)
        for t in leaves:
            t.grad = None

    arms = dict(steps, **batched, **local_steps, single=single, control=steps["rank0"])
    timer = time_once if device.type == "cuda" else time_on_host
    per_group = measure(arms, args.groups, args.iters, args.l2, time=timer)
    ms = {n: statistics.median(m) for n, m in per_group.items()}
    rank_ms = [ms[f"rank{r}"] for r in range(W)]
    local_ms = [ms[f"local{r}"] for r in range(W)]
    slowest = max(rank_ms)
    # Where the slowest rank's time goes: its kernels' device time per phase of the call
    # (cake.kcp's profiler ranges; "other": the compositions, copies and the rest).
    phases = phase_times(steps[f"rank{rank_ms.index(slowest)}"], "cake.kcp.")
    ctx0 = ranks[0][0]
    HV, Kd, Vd = inputs[2].shape[2], inputs[0].shape[3], inputs[2].shape[3]
    sizes = ctx0.exchange_bytes(HV, Kd, Vd)
    line = dict(
        meta, workload=pack, W=W, layout=layout, segments=segments, op=op, arm="cake_kcp",
        P=list(ctx0.segment_plan(HV)), slowest_rank_ms=slowest, rank_ms=rank_ms,
        local_ms=local_ms, overhead_ms=[a - b for a, b in zip(rank_ms, local_ms)],
        single_ms=ms["single"], efficiency=ms["single"] / (W * slowest),
        control_ratio=ms["control"] / ms["rank0"], o_rel_rms_vs_single=agreement,
        slowest_rank_phases_ms=phases,
        **(dict(batched_rank_ms=[ms[f"batched{r}"] for r in range(W)],
                batched_slowest_rank_ms=max(ms[f"batched{r}"] for r in range(W)),
                o_rel_rms_batched_vs_in_place=max(rel_rms(b[4], a[4])
                                                  for a, b in zip(ranks, batched_ranks)))
           if batched else {}),
        drift=max(((m[-1] - m[0]) / m[0] for m in per_group.values()), key=abs),
        peak_extra_gib=[peak_bytes(s) / 2**30 if device.type == "cuda" else None
                        for s in steps.values()],
        exchange_bytes=dict(forward_send=sizes.forward_send,
                            forward_receive=sizes.forward_receive,
                            backward_send=sizes.backward_send if op == "fwd+bwd" else 0,
                            backward_receive=sizes.backward_receive if op == "fwd+bwd" else 0))
    if out:
        out.write(json.dumps(line) + "\n")
        out.flush()
    print(f"{pack:5s} W={W} {layout:19s} seg={segments} {op:7s} P={line['P']} slowest "
          f"{slowest:8.3f} ms  single/W {ms['single'] / W:8.3f} ms  efficiency "
          f"{line['efficiency']:.2f}  overhead max {max(line['overhead_ms']):7.3f} ms  control "
          f"{line['control_ratio']:.3f}  o vs single {agreement:.1e}", flush=True)
    if batched:
        print(f"{'':5s} every span batched: slowest {line['batched_slowest_rank_ms']:8.3f} ms",
              flush=True)
    if phases:
        print(f"{'':5s} slowest rank's kernels by phase: {summary(phases)}", flush=True)
    return line


def _local_step(single_fn, op, ctx, local, do_local):
    """The rank's own walk alone: the single-rank op over its shard, no state passing."""
    o, _ = single_fn(*local, cu_seqlens=ctx.cu_seqlens, use_qk_l2norm_in_kernel=True)
    if op == "fwd+bwd":
        o.backward(do_local)
    for t in local:
        t.grad = None


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--packs", nargs="+", default=["P1", "P2", "P3", "P4", "P5"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--layouts", nargs="+", default=None)
    parser.add_argument("--segments", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--ops", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    parser.add_argument("--variant", choices=["gdn", "kda"], default="gdn")
    parser.add_argument("--heads", nargs=2, type=int, default=None, metavar=("H", "HV"))
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--batched-arm", action="store_true",
                        help="also time every rank with all spans' products batched")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import cake
    import cake.kcp as kcp

    device = torch.device(args.device)
    kda = args.variant == "kda"
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
    single_fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    workloads = json.loads((HERE / "workloads.json").read_text())["gdn"]
    spec, single = workloads["context_parallel"], workloads["single_gpu"]
    packs = dict(spec["packs"], **{w: single[w]["docs"] for w in ("A", "G", "M")},
                 D256K=PACK_D256K)
    unknown = sorted(set(args.packs) - set(packs))
    if unknown:
        parser.error(f"--packs: no pack {unknown}; there are {sorted(packs)}")
    H, HV = args.heads or (spec["heads_qk"], spec["heads_v"])
    dtype = torch.bfloat16
    if device.type == "cpu":  # the smoke run: tiny packs in FP64 on the reference
        packs = {name: [max(1, n // 2048) for n in docs] for name, docs in packs.items()}
        H, HV, dtype = 1, 2, torch.float64
    layouts = args.layouts or list(kcp.LAYOUTS)
    meta = dict(date=datetime.date.today().isoformat(),
                gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                commit=os.environ.get("CAKE_COMMIT") or git_commit(), torch=torch.__version__,
                versions=dict(cake=cake.__version__), variant=args.variant, heads=[H, HV])
    args.l2 = (torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
               if device.type == "cuda" else None)
    out = args.out.open("a") if args.out else None
    lines = []
    for pack in args.packs:
        docs = packs[pack]
        cu = torch.tensor([0] + docs, device=device).cumsum(0).to(torch.int32)
        inputs, do = make_inputs(sum(docs), H, HV, kda, device, dtype)
        for W in args.worlds:
            for layout in (layouts if W > 1 else ["contiguous"]):
                for segments in args.segments:
                    for op in args.ops:
                        lines.append(bench_cell(args, cake, kcp, fn, single_fn, pack, W, layout,
                                                segments, op, inputs, do, cu, device, meta,
                                                out))
    return lines


if __name__ == "__main__":
    main()
