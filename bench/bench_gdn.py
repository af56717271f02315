"""GDN benchmark: cake against flash-linear-attention and FlashQLA, side by side in one run.

    python bench/bench_gdn.py --workloads A G M N --ops fwd fwd+bwd ckpt --out results.jsonl

Protocol (bench/workloads.json, "timing_protocol"): CUDA events; L2 flushed and the device
synchronised before every timed iteration; per op one untimed call per arm, then groups that
visit the arms in palindromic order (a, b, c, c, b, a) with several timed iterations per visit; a
cell is the median over groups of each group's median; a control arm (a second visit of cake)
measures noise; drift is the change of an arm's median between the first and the last group.
Speedup = baseline ms / cake ms. For cake's arms, `kernels_ms`: the time of each kernel of one
further call (kernel_times.py). Peak memory (`peak_gib`): the allocator's peak over one call of
the op beyond what was allocated before it (the inputs and dO), measured once per arm after the
timing: outputs, what the forward keeps for the backward, the gradients and every workspace.
The gate g is drawn as `--gate` says, each value a run of every cell: "workloads" = logsigmoid(x),
x ~ N(0, 1) (the workloads file's draw), or "slow" = logsigmoid(x + 2) (a slower decay). One JSON
line per (gate, workload, op, arm).

Arms: "cake" (inverse mode, the default); "cake_saved" (saved mode); "cake_recompute" (recompute
mode); "fla" = flash-linear-attention's Triton kernels with its FlashQLA dispatch disabled
(FLA_FLASH_QLA=0; its TileLang dq/dk kernel stays on, as FLA requires on Hopper with Triton < 3.7.1);
"flashqla" = flash_qla.chunk_gated_delta_rule as its users call it (auto_cp=True: FlashQLA may split
long documents into segments on one GPU, each segment's start state from a warm-up over the
previous one's tail cut off once the gate has decayed past e^-10 (hopper/cp_fwd.py
get_warmup_chunks, threshold -10): approximate); "flashqla_nocp" = the same with auto_cp=False
(one exact walk per document and head, as cake); "cake_segments" = cake given cu_seqlens_cpu
too (the host copy of cu_seqlens, made once before the timing), so that it walks the documents as
exact segments where its plan predicts a gain (cake.segments); "cake_control" = cake again.
"""

import argparse
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("FLA_FLASH_QLA", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from kernel_times import kernel_times  # noqa: E402
from kernel_times import summary as kernel_summary  # noqa: E402

HERE = Path(__file__).resolve().parent
K = V = 128


# The arms whose kernels are profiled once per cell (kernel_times.py), after the timing.
PROFILED_ARMS = ("cake", "cake_segments", "cake_kcp_p4", "cake_kcp_plan")


def with_host_offsets(fn):
    """fn given cu_seqlens_cpu too: the host copy of its cu_seqlens, made at the first call with
    that tensor (the untimed one) and kept, so that no timed call copies it."""
    host = {}

    def call(*args, cu_seqlens, **kwargs):
        if id(cu_seqlens) not in host:
            host[id(cu_seqlens)] = (cu_seqlens, cu_seqlens.cpu())  # the tensor kept: ids stay
        return fn(*args, cu_seqlens=cu_seqlens, cu_seqlens_cpu=host[id(cu_seqlens)][1], **kwargs)
    return call


def load_arms():
    """name -> (function with FLA's signature, version string); missing packages are skipped."""
    import cake
    # "cake": the default mode (inverse: the chunk inverses kept, as FLA keeps them);
    # "cake_saved": the forward keeps all the backward reads; "cake_recompute": it keeps nothing.
    arms = {"cake": (cake.chunk_gated_delta_rule, cake.__version__),
            "cake_saved": (functools.partial(cake.chunk_gated_delta_rule,
                                             save_for_backward="saved"), cake.__version__),
            "cake_recompute": (functools.partial(cake.chunk_gated_delta_rule,
                                                 save_for_backward="recompute"),
                               cake.__version__),
            "cake_segments": (with_host_offsets(cake.chunk_gated_delta_rule), cake.__version__)}
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
        arms["fla"] = (fla_gdn, getattr(fla, "__version__", "?"))
    except Exception as e:  # noqa: BLE001 - report and go on without the arm
        print(f"flash-linear-attention unavailable: {e}", file=sys.stderr)
    try:
        import flash_qla
        arms["flashqla"] = (flash_qla.chunk_gated_delta_rule, flash_qla.__version__)
        arms["flashqla_nocp"] = (functools.partial(flash_qla.chunk_gated_delta_rule,
                                                   auto_cp=False), flash_qla.__version__)
    except Exception as e:  # noqa: BLE001
        print(f"FlashQLA unavailable: {e}", file=sys.stderr)
    arms["cake_control"] = arms["cake"]
    return arms


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=HERE).stdout.strip() or "unknown"
    except OSError:  # no git on the machine
        return "unknown"


def chosen_arms(arms, wanted):
    """The arms named in wanted (all when it is None), always with cake and its control: every
    ratio and the noise band are against them."""
    if wanted is None:
        return arms
    return {n: a for n, a in arms.items() if n in wanted or n in ("cake", "cake_control")}


GATE_SHIFT = {"workloads": 0.0, "slow": 2.0}


def make_inputs(docs, H, HV, seed=0, gate="workloads"):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(docs)
    kw = dict(device="cuda", generator=gen)
    q = torch.randn(1, T, H, K, dtype=torch.bfloat16, **kw)
    k = torch.randn(1, T, H, K, dtype=torch.bfloat16, **kw)
    v = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    g = F.logsigmoid(torch.randn(1, T, HV, **kw) + GATE_SHIFT[gate])
    beta = torch.rand(1, T, HV, **kw)
    cu = torch.tensor([0] + docs, device="cuda").cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    return (q, k, v, g, beta), cu, do


def make_step(fn, op, leaves, cu, do, **options):
    """A closure running one `op` of `fn` on the leaf inputs with the op's keyword options
    (shared by every arm; the gradients are dropped after each call, so that no arm holds memory
    while another one runs)."""

    def forward():
        o, _ = fn(*leaves, cu_seqlens=cu, **options)
        return o

    def run():
        if op == "fwd":
            forward()
        elif op == "fwd+bwd":
            forward().backward(do)
        elif op == "ckpt":
            checkpoint(forward, use_reentrant=False).backward(do)
        else:
            raise ValueError(op)
        for t in leaves:
            t.grad = None
    return run


def peak_bytes(run):
    """The allocator's peak over one call of run beyond what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def steps_that_run(steps, leaves, report):
    """The steps whose first, untimed call succeeds. A baseline arm that fails there (a version
    refusing the shape, a compile error) is left out and reported, report(name, error), so that
    one baseline cannot end a run whose device time is scarce. cake's arms are left out only when
    the GPU's memory does not hold them (a shape too large for the card, as KDA's A on an H100);
    any other failure of theirs is the run's."""
    kept = {}
    for name, step in steps.items():
        caught = torch.cuda.OutOfMemoryError if name.startswith("cake") else Exception
        try:
            step()
        except caught as e:  # noqa: BLE001 - whatever a baseline raises, it skips
            report(name, e)
            torch.cuda.empty_cache()
            continue
        finally:
            for t in leaves:
                t.grad = None
        kept[name] = step
    return kept


def rel_rms(x, ref):
    """||x - ref|| / ||ref||, in fp32 (fp64 where either is fp64), 2^26 elements at a time (fp32
    copies of a whole KDA P4_H64 gradient would take 9 GB each)."""
    wide = torch.float64 if torch.float64 in (x.dtype, ref.dtype) else torch.float32
    err = norm = 0.0
    for a, b in zip(x.detach().flatten().split(1 << 26), ref.detach().flatten().split(1 << 26)):
        a, b = a.to(wide), b.to(wide)
        err += (a - b).square().sum().item()
        norm += b.square().sum().item()
    return (err / max(norm, 1e-30)) ** 0.5


def agreement_with_cake(arms, results, leaves, skip=()):
    """Once per shape, each baseline's results against cake's, relative RMS per tensor: the arms
    must compute the same thing for their times to compare. results(fn) -> {tensor name: tensor};
    arms in skip (and cake's own) are left out. {arm: {tensor: rel-RMS} or why not compared}."""
    mine = results(arms["cake"][0])
    agreement = {}
    for name, (fn, _) in arms.items():
        if name.startswith("cake") or name in skip:
            continue
        try:
            theirs = results(fn)
            agreement[name] = {n: rel_rms(theirs[n], mine[n]) for n in mine}
            del theirs
        except Exception as e:  # noqa: BLE001 - a failing baseline skips at its first step
            agreement[name] = f"not compared: {type(e).__name__}: {' '.join(str(e).split())}"
        finally:
            for t in leaves:
                t.grad = None
        torch.cuda.empty_cache()
    return agreement


def flush_l2(buffer):
    buffer.zero_()


def time_once(run, l2, wait=None):
    """One timed call of run, the L2 flushed and the device idle before it; ``wait()`` is called
    just before the clock starts (bench_kcp.py: a barrier across ranks)."""
    flush_l2(l2)
    torch.cuda.synchronize()
    if wait is not None:
        wait()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def measure(steps, groups, iters, l2, time=time_once):
    """Palindromic visits; returns name -> list of per-group medians (ms). ``time(run, l2)`` times
    one iteration (bench_kcp.py's waits for every rank and takes the slowest); it synchronises
    before it starts, so the untimed calls have ended before the first timed one."""
    names = list(steps)
    for name in names:  # one untimed call per arm (compilation, autotuning, allocator)
        steps[name]()
    per_group = {n: [] for n in names}
    for _ in range(groups):
        samples = {n: [] for n in names}
        for name in names + names[::-1]:
            for _ in range(iters):
                samples[name].append(time(steps[name], l2))
        for n in names:
            per_group[n].append(statistics.median(samples[n]))
    return per_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="+", default=["A", "G", "M", "N"])
    parser.add_argument("--ops", nargs="+", default=["fwd", "fwd+bwd", "ckpt"])
    parser.add_argument("--arms", nargs="+", default=None, help="subset of arms")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--gate", nargs="+", choices=sorted(GATE_SHIFT), default=["workloads"],
                        help="how g is drawn, one run of every cell per value: logsigmoid(x) "
                             "(the workloads file) or logsigmoid(x + 2) (slower decay)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    spec = json.loads((HERE / "workloads.json").read_text())["gdn"]["single_gpu"]
    arms = chosen_arms(load_arms(), args.arms)
    commit = os.environ.get("CAKE_COMMIT") or git_commit()
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                commit=commit, torch=torch.__version__,
                versions={n: a[1] for n, a in arms.items()})
    l2 = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    out = args.out.open("a") if args.out else None
    for gate, wl in ((gate, wl) for gate in args.gate for wl in args.workloads):
        docs, H, HV = spec[wl]["docs"], spec[wl]["heads_qk"], spec[wl]["heads_v"]
        inputs, cu, do = make_inputs(docs, H, HV, gate=gate)
        leaves = [t.requires_grad_() for t in inputs]
        cell = f"{wl:2s} {gate[:4]:4s}"
        for op in args.ops:
            steps = {n: make_step(a[0], op, leaves, cu, do, use_qk_l2norm_in_kernel=True)
                     for n, a in arms.items()}
            per_group = measure(steps, args.groups, args.iters, l2)
            peak_gib = {n: peak_bytes(s) / 2**30 for n, s in steps.items()}
            kernels = {n: kernel_times(steps[n]) for n in PROFILED_ARMS if n in steps}
            cake_ms = statistics.median(per_group["cake"])
            for name, medians in per_group.items():
                ms = statistics.median(medians)
                line = dict(meta, workload=wl, op=op, arm=name, gate=gate, ms=ms,
                            peak_gib=peak_gib[name], kernels_ms=kernels.get(name),
                            speedup_vs_cake=None if name.startswith("cake") else ms / cake_ms,
                            drift=(medians[-1] - medians[0]) / medians[0], groups=medians)
                if out:  # line by line, so that a run cut short keeps its finished cells
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                print(f"{cell} {op:8s} {name:13s} {ms:9.3f} ms {peak_gib[name]:6.2f} GiB"
                      + ("" if line["speedup_vs_cake"] is None
                         else f"   cake is {line['speedup_vs_cake']:.2f}x faster")
                      + f"   drift {100 * line['drift']:+.1f}%", flush=True)
            control = statistics.median(per_group["cake_control"]) / cake_ms
            print(f"{cell} {op:8s} control ratio {control:.3f} (accept 0.98-1.02)", flush=True)
            for name, times in kernels.items():
                print(f"{cell} {op:8s} {name} kernels: {kernel_summary(times)}", flush=True)
            del steps
            torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
