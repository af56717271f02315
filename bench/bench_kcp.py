"""Context parallelism across GPUs: the KCP packs of bench/workloads.json ("gdn" and "kda",
"context_parallel") at the world size W that torchrun gives, each layout, cake.kcp against the
context parallelism of flash-linear-attention and FlashQLA, with each arm's single-GPU time of the
whole pack for the scaling efficiency (single ms / (W x ms)).

    torchrun --standalone --nproc_per_node 4 bench/bench_kcp.py --variants gdn --out kcp.jsonl
    torchrun --standalone --nproc_per_node 2 bench/bench_kcp.py --backend gloo --device cpu

Protocol (workloads.json "timing_protocol", as bench_gdn.py, across ranks): CUDA events; the L2
flushed, the device synchronised and a barrier across the ranks before every timed iteration; the
slowest rank counts (an iteration's time is the maximum of the ranks' times, all-reduced after
it); per op one untimed call per arm, then groups that visit the arms in palindromic order with
several iterations per visit; a cell is the median over groups of each group's median; a control
arm (cake again) measures noise; drift = change of an arm's median between the first and the last
group. Speedup = arm ms / cake ms. Before the distributed part of a workload, rank 0 alone times
the whole pack on its GPU with each arm's single-GPU op (the other ranks wait at a barrier). One
JSON line per (workload, layout, op, arm), as bench_gdn.py's, with W, the layout, the slowest
rank's peak memory beyond the inputs and, for cake, every rank's segment count P; the single-GPU
lines have layout "single_gpu" and W = 1.

Workloads: GDN P1-P5 at 16 q/k and 48 value heads, inputs as bench_gdn.py (bf16 q, k, v; fp32 g,
beta; the q/k L2 norm in the kernel); KDA P4, Q1-Q6 at H = HV = 4, 16, 64 (--heads), inputs as
bench_kda.py (q, k L2-normalised by the caller, g in (-5, 0) per channel, bf16 beta). No initial
or final states: FLA's context parallelism takes neither.

Arms, on each layout that they take (the others are skipped with the reason printed; --pad
appends one document of fewer than 2W tokens to a pack whose T does not divide by 2W, for every
arm, so that the baselines take it too: GDN P1-P3 at W = 4):
  cake            cake.kcp.chunk_gated_delta_rule_kcp / chunk_kda_kcp, the segment plan's P, every
                  layout; single GPU: cake.chunk_gated_delta_rule / chunk_kda.
  fla             FLA 0.6.0's chunk_gated_delta_rule / chunk_kda with its cp_context
                  (fla.ops.cp.build_cp_context): "contiguous" where T divides by W, "zigzag" where
                  T divides by 2W (parts r and 2W-1-r, as cake's zigzag); no per-document layout.
                  Single GPU: the same op without a context, its FlashQLA dispatch off
                  (FLA_FLASH_QLA=0, as bench_gdn.py).
  flashqla        GDN only: FlashQLA 0.1.3's inter-card context parallelism as its users call it
                  (flash_qla's cp.build_cp_context with enable_inter and enable_intra: exact across
                  GPUs, and within a GPU its automatic split whose segments start from a
                  gate-truncated warm-up, approximate), "contiguous" where T divides by W (its only
                  layout); single GPU: flash_qla.chunk_gated_delta_rule (auto_cp=True).
  flashqla_exact  the same with enable_intra=False (exact); single GPU: auto_cp=False.
  cake_control    cake again.
A baseline whose first call of a cell raises on any rank is left out of that cell, its error
printed. Every arm of a layout reads the same local tensors (cake.kcp.shard of the global inputs,
the same on every rank from one seed); the set-up checks that each baseline's context holds as
many local tokens as cake's, with every sequence boundary of cake's among its own.

On the CPU (--device cpu, gloo): a smoke run of the harness, a tiny pack of 200 tokens, float64,
cake's FP64 reference, host timers, cake alone.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

# NVLink multicast stays off (NCCL, PyTorch's symmetric memory, NVSHMEM): on the shared multi-GPU
# machines a program that uses it can put the host's GPUs out of service. Set before any
# communicator exists, whatever the caller's environment says.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
# bench_gdn sets FLA_FLASH_QLA=0 on import, before FLA is imported.
import bench_gdn  # noqa: E402
import bench_kda  # noqa: E402
from bench_gdn import git_commit, measure, time_once  # noqa: E402

import cake  # noqa: E402
import cake.kcp as kcp  # noqa: E402

HERE = Path(__file__).resolve().parent
# The CPU smoke run's pack: documents of 40, 90 and 70 tokens, H = 1, HV = 2, K = V = 8.
SMOKE_DOCS, SMOKE_DIMS = [40, 90, 70], (1, 2, 8)


@dataclass
class Arm:
    """One implementation. single(leaves, cu_seqlens) -> o on the whole pack; context(cu_seqlens,
    layout, cake_ctx, HV) -> its context for this rank, or the reason (str) it does not take the
    layout; cp(local leaves, context) -> o on this rank's tokens."""
    name: str
    version: str
    single: Callable
    context: Callable
    cp: Callable


def cake_arm(kda: bool, opts: dict) -> Arm:
    single = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    cp = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
    return Arm("cake", cake.__version__,
               single=lambda x, cu: single(*x, cu_seqlens=cu, **opts)[0],
               context=lambda cu, layout, ctx, HV: ctx,
               cp=lambda x, ctx: cp(*x, ctx, **opts)[0])


def fla_arm(kda: bool, opts: dict) -> Arm:
    import fla
    from fla.ops.cp import build_cp_context
    if kda:
        from fla.ops.kda import chunk_kda as fn
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn

    def context(cu, layout, ctx, HV):
        try:  # FLA refuses a layout it lacks, and T that its parts do not divide
            return build_cp_context(cu, group=dist.group.WORLD, layout=layout)
        except ValueError as e:
            return str(e)

    return Arm("fla", fla.__version__,
               single=lambda x, cu: fn(*x, cu_seqlens=cu, **opts)[0],
               context=context,
               cp=lambda x, c: fn(*x, cp_context=c, **opts)[0])


def flashqla_arm(intra: bool, opts: dict) -> Arm:
    import flash_qla
    from flash_qla.ops.gated_delta_rule.chunk import CHUNK_SIZE
    from flash_qla.ops.gated_delta_rule.chunk.cp import build_cp_context

    def context(cu, layout, ctx, HV):
        W, T = ctx.world_size, ctx.num_global_tokens
        if layout != "contiguous":
            return "FlashQLA's inter-card context parallelism has the contiguous layout only"
        if T % W:
            return f"FlashQLA's inter-card context parallelism needs T = {T} divisible by W = {W}"
        # is_train: a training step (the leaves require grad), in its forward and backward alike.
        return build_cp_context(cu, enable_inter=True, enable_intra=intra,
                                group=dist.group.WORLD, num_v_heads=HV,
                                chunk_size=CHUNK_SIZE, is_train=True)

    return Arm("flashqla" if intra else "flashqla_exact", flash_qla.__version__,
               single=lambda x, cu: flash_qla.chunk_gated_delta_rule(
                   *x, cu_seqlens=cu, auto_cp=intra, **opts)[0],
               context=context,
               cp=lambda x, c: flash_qla.chunk_gated_delta_rule(*x, cp_context=c, **opts)[0])


def load_arms(kda: bool, device: torch.device, wanted) -> list[Arm]:
    """The arms in visiting order; a baseline that does not import (or needs a GPU) is left out
    with the reason printed."""
    opts = {} if kda else {"use_qk_l2norm_in_kernel": True}
    arms = [cake_arm(kda, opts)]
    if device.type == "cuda":
        makers = [("fla", lambda: fla_arm(kda, opts))]
        if not kda:
            makers += [("flashqla", lambda: flashqla_arm(True, opts)),
                       ("flashqla_exact", lambda: flashqla_arm(False, opts))]
        for name, make in makers:
            if wanted and name not in wanted:
                continue
            try:
                arms.append(make())
            except Exception as e:  # noqa: BLE001 - report and go on without the arm
                say(f"{name} unavailable: {type(e).__name__}: {e}")
    control = arms[0]
    arms.append(Arm("cake_control", control.version, control.single, control.context,
                    control.cp))
    return arms


def say(text: str) -> None:
    """Prints on rank 0 (every rank runs the same program and would print the same)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(text, flush=True)


def workloads(args, spec) -> list[tuple]:
    """(variant, name, docs, H, HV) of every workload asked for."""
    if args.device == "cpu":
        H, HV, _ = SMOKE_DIMS
        return [(v, "smoke", SMOKE_DOCS, H, HV) for v in args.variants]
    out = []
    for variant in args.variants:
        cp = spec[variant]["context_parallel"]
        for pack, docs in cp["packs"].items():
            if args.packs and pack not in args.packs:
                continue
            if variant == "gdn":
                out.append((variant, pack, docs, cp["heads_qk"], cp["heads_v"]))
            else:
                out += [(variant, f"{pack}_H{h}", docs, h, h) for h in args.heads]
    return out


def make_inputs(variant: str, docs, H: int, HV: int, device: torch.device):
    """((q, k, v, g, beta), cu_seqlens, do) of the global pack, the same on every rank (one seed):
    on a GPU bench_gdn.py's or bench_kda.py's, on the CPU float64 of the smoke run's size."""
    if device.type == "cuda":
        return (bench_kda if variant == "kda" else bench_gdn).make_inputs(docs, H, HV)
    gen = torch.Generator().manual_seed(0)
    T, K = sum(docs), SMOKE_DIMS[2]

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    g = -torch.rand(1, T, HV, K, generator=gen, dtype=torch.float64) if variant == "kda" \
        else torch.nn.functional.logsigmoid(randn(1, T, HV))
    inputs = (randn(1, T, H, K), randn(1, T, H, K), randn(1, T, HV, K), g,
              torch.rand(1, T, HV, generator=gen, dtype=torch.float64))
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    return inputs, cu, randn(1, T, HV, K)


def make_step(forward: Callable, op: str, leaves, do):
    """One `op` of an arm: the forward (with autograd recording) and, for fwd+bwd, its backward;
    the gradients are dropped after each call so that no arm holds memory while another runs."""

    def run():
        o = forward()
        if op == "fwd+bwd":
            o.backward(do)
        for t in leaves:
            t.grad = None
    return run


def iteration_timer(device: torch.device, distributed: bool):
    """time(run, l2) for bench_gdn.measure: one iteration's milliseconds, started after every rank
    has reached it, and the slowest rank's (all ranks) when distributed."""

    def wait_for_everyone():
        if distributed:
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()  # the barrier's collective has ended on this GPU

    def timed(run, l2):
        if device.type == "cuda":
            ms = time_once(run, l2, wait=wait_for_everyone)
        else:
            wait_for_everyone()
            start = time.perf_counter()
            run()
            ms = 1e3 * (time.perf_counter() - start)
        return over_ranks(ms, device) if distributed else ms
    return timed


def over_ranks(x: float, device: torch.device, op=dist.ReduceOp.MAX) -> float:
    """x reduced over the ranks (by default the maximum)."""
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.item()


def runnable(steps: dict, device: torch.device, distributed: bool) -> dict:
    """The steps of the baselines whose first call runs on every rank, and cake's: a baseline that
    raises (a shape or layout it refuses, memory it lacks) is dropped with its error printed rather
    than ending the run. An error raised on every rank before any collective, as those are, keeps
    the ranks in step; cake's errors end the run."""
    kept = {}
    for name, run in steps.items():
        error = None
        if not name.startswith("cake"):
            try:
                run()
            except Exception as e:  # noqa: BLE001 - reported, the arm dropped
                error = f"{type(e).__name__}: {e}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        ok = error is None
        if distributed:
            ok = over_ranks(float(ok), device, dist.ReduceOp.MIN) == 1.0
        if ok:
            kept[name] = run
        else:
            print(f"rank {dist.get_rank()}: {name} dropped: {error or 'it failed on another rank'}",
                  flush=True)
    return kept


def peak_gib(run, device: torch.device, distributed: bool) -> Union[float, None]:
    """The peak memory one call allocates beyond what was allocated before it (GiB), the largest
    over the ranks when distributed; None on the CPU."""
    if device.type != "cuda":
        return None
    gib = bench_gdn.peak_bytes(run) / 2**30
    return over_ranks(gib, device) if distributed else gib


def same_tokens(arm_ctx, ctx) -> bool:
    """Whether a baseline's context holds this rank's tokens as cake's does: as many, and every
    sequence boundary of cake's among its own (FLA keeps a document that runs from rank W-1's
    front part into its back part as two sequences, cake as one)."""
    theirs = set(arm_ctx.cu_seqlens.tolist())
    return (max(theirs) == ctx.num_tokens
            and set(ctx.cu_seqlens.tolist()) <= theirs)


def report(out, meta: dict, cell: dict, per_group: dict, peaks: dict, extra: dict) -> None:
    """Writes one JSON line per arm (rank 0) and prints the cell, with the control ratio."""
    if dist.get_rank() != 0:
        return
    cake_ms = statistics.median(per_group["cake"])
    label = f"{meta['variant']} {meta['workload']:8s} {cell['layout']:19s} {cell['op']:8s}"
    for arm, medians in per_group.items():
        ms = statistics.median(medians)
        line = dict(meta, **cell, arm=arm, ms=ms,
                    speedup_vs_cake=None if arm.startswith("cake") else ms / cake_ms,
                    drift=(medians[-1] - medians[0]) / medians[0], groups=medians,
                    peak_extra_gib=peaks[arm], **extra.get(arm, {}))
        if out:  # line by line, so that a run cut short keeps its finished cells
            out.write(json.dumps(line) + "\n")
            out.flush()
        gib = "" if line["peak_extra_gib"] is None else f" {line['peak_extra_gib']:6.2f} GiB"
        print(f"{label} {arm:14s} {ms:9.3f} ms{gib}"
              + ("" if line["speedup_vs_cake"] is None
                 else f"   cake is {line['speedup_vs_cake']:.2f}x faster")
              + ("" if line.get("scaling_efficiency") is None
                 else f"   scaling {line['scaling_efficiency']:.2f}")
              + f"   drift {100 * line['drift']:+.1f}%", flush=True)
    control = statistics.median(per_group["cake_control"]) / cake_ms
    print(f"{label} control ratio {control:.3f} (accept 0.98-1.02)", flush=True)


@dataclass
class Bench:
    """One workload's global inputs (the same on every rank) and what its timings need."""
    args: argparse.Namespace
    device: torch.device
    l2: Union[torch.Tensor, None]
    out: object
    meta: dict
    arms: list
    leaves: list
    cu: torch.Tensor
    do: torch.Tensor

    def single_gpu(self) -> dict:
        """The whole pack on this GPU alone with each arm's single-GPU op (rank 0): {(op, arm):
        ms}, and the cells reported."""
        timer = iteration_timer(self.device, distributed=False)
        single_ms = {}
        for op in self.args.ops:
            steps = runnable({a.name: make_step(lambda a=a: a.single(self.leaves, self.cu), op,
                                                self.leaves, self.do) for a in self.arms},
                             self.device, distributed=False)
            per_group = measure(steps, self.args.groups, self.args.iters, self.l2, time=timer)
            peaks = {n: peak_gib(s, self.device, False) for n, s in steps.items()}
            single_ms.update({(op, n): statistics.median(m) for n, m in per_group.items()})
            report(self.out, self.meta, dict(world_size=1, layout="single_gpu", op=op),
                   per_group, peaks, {})
        return single_ms

    def context_parallel(self, layout: str, num_sms: int, single_ms: dict) -> None:
        """Every arm that takes the layout, on this rank's shard, across the ranks."""
        W, HV = dist.get_world_size(), self.meta["heads"][1]
        ctx = kcp.build_context(self.cu, group=dist.group.WORLD, layout=layout, num_sms=num_sms)
        local = [kcp.shard(x.detach(), ctx).requires_grad_() for x in self.leaves]
        local_do = kcp.shard(self.do, ctx)
        contexts = {}
        for a in self.arms:
            c = a.context(self.cu, layout, ctx, HV)
            if isinstance(c, str):
                say(f"{self.meta['workload']} {layout}: {a.name} skipped: {c}")
            elif a.name.startswith("cake") or same_tokens(c, ctx):
                contexts[a.name] = c
            else:
                raise RuntimeError(f"{a.name}'s context holds other tokens than cake's on rank "
                                   f"{ctx.rank} ({layout})")
        timer = iteration_timer(self.device, distributed=True)
        for op in self.args.ops:
            steps = runnable({a.name: make_step(lambda a=a: a.cp(local, contexts[a.name]), op,
                                                local, local_do)
                              for a in self.arms if a.name in contexts},
                             self.device, distributed=True)
            per_group = measure(steps, self.args.groups, self.args.iters, self.l2, time=timer)
            peaks = {n: peak_gib(s, self.device, True) for n, s in steps.items()}
            extra = {n: {} for n in steps}
            extra["cake"]["segments"] = list(ctx.segment_plan(HV))
            for n, medians in per_group.items():
                if (op, n) in single_ms:
                    extra[n]["single_gpu_ms"] = single_ms[(op, n)]
                    extra[n]["scaling_efficiency"] = (
                        single_ms[(op, n)] / (W * statistics.median(medians)))
            report(self.out, self.meta, dict(world_size=W, layout=layout, op=op), per_group,
                   peaks, extra)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=("gdn", "kda"), default=["gdn", "kda"])
    parser.add_argument("--packs", nargs="+", default=None,
                        help="pack names (GDN P1-P5, KDA P4 Q1-Q6); default every pack")
    parser.add_argument("--heads", nargs="+", type=int, default=[4, 16, 64],
                        help="KDA's head counts (H = HV)")
    parser.add_argument("--layouts", nargs="+", choices=kcp.LAYOUTS, default=list(kcp.LAYOUTS))
    parser.add_argument("--ops", nargs="+", choices=("fwd", "fwd+bwd"),
                        default=["fwd", "fwd+bwd"])
    parser.add_argument("--arms", nargs="+", default=None,
                        help="baselines to run (fla flashqla flashqla_exact); cake always runs")
    parser.add_argument("--pad", action="store_true",
                        help="append a document of the (< 2W) tokens that make T a multiple of "
                             "2W, for every arm, so that FLA's and FlashQLA's CP take the pack")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.backend == "nccl" and args.device == "cpu":
        parser.error("NCCL exchanges CUDA tensors: use --backend gloo with --device cpu")
    return args


def main():
    args = parse_args()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    # Long enough for rank 0's single-GPU timing (with FLA's autotuning and FlashQLA's compile),
    # during which the other ranks wait at a barrier.
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=30),
                            device_id=device if device.type == "cuda" else None)
    W, rank = dist.get_world_size(), dist.get_rank()
    spec = json.loads((HERE / "workloads.json").read_text())
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else 132)
    l2 = (torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
          if device.type == "cuda" else None)
    out = args.out.open("a") if args.out and rank == 0 else None
    start = time.monotonic()
    arms = {v: load_arms(v == "kda", device, args.arms) for v in args.variants}
    for variant, name, docs, H, HV in workloads(args, spec):
        # --pad: one short document more, so that T divides by 2W and the baselines run the pack.
        padding = (-sum(docs)) % (2 * W) if args.pad else 0
        docs = docs + [padding] if padding else docs
        meta = dict(date=datetime.date.today().isoformat(), gpu=gpu,
                    commit=os.environ.get("CAKE_COMMIT") or git_commit(), torch=torch.__version__,
                    versions={a.name: a.version for a in arms[variant]}, backend=args.backend,
                    op_name="chunk_kda" if variant == "kda" else "chunk_gated_delta_rule",
                    variant=variant, workload=name, heads=[H, HV], tokens=sum(docs),
                    padded_tokens=padding)
        inputs, cu, do = make_inputs(variant, docs, H, HV, device)
        bench = Bench(args, device, l2, out, meta, arms[variant],
                      [t.requires_grad_() for t in inputs], cu, do)
        single_ms = bench.single_gpu() if rank == 0 else {}
        dist.barrier()  # the other ranks wait for rank 0's single-GPU times
        for layout in args.layouts:
            bench.context_parallel(layout, num_sms, single_ms)
        del bench, inputs, do
        if device.type == "cuda":
            torch.cuda.empty_cache()
        say(f"{variant} {name}: done after {time.monotonic() - start:.0f} s")
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
