"""KDA benchmark: cake against flash-linear-attention, side by side in one run, with
bench_gdn.py's protocol (bench/workloads.json "timing_protocol": CUDA events, L2 flushed, arms in
palindromic order, medians, a control arm) and its JSON lines, plus each arm's peak extra memory.

    python bench/bench_kda.py --workloads P4 A --ops fwd fwd+bwd ckpt --out results.jsonl

Workloads: "P4" (workloads.json "kda" single_gpu: 4 documents, 261,392 tokens) at H = HV = 4, 16
and 64 (--heads), inputs as workloads.json says (q, k L2-normalised by the caller, g in (-5, 0),
bf16 beta); "A" the grouped shape: GDN workload A's documents with 16 q/k heads and 48 value heads.
Arms: "cake" (the default mode), "cake_saved", "fla" (flash-linear-attention's chunk_kda, its
Triton kernels), "cake_control". cuDNN frontend's Hopper KDA engine is not an arm yet.
"""

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gdn import git_commit, make_step, measure  # noqa: E402

HERE = Path(__file__).resolve().parent
K = V = 128


def load_arms():
    """name -> (function with FLA's chunk_kda signature, version); missing packages skipped."""
    import cake
    arms = {"cake": (cake.chunk_kda, cake.__version__),
            "cake_saved": (functools.partial(cake.chunk_kda, save_for_backward="saved"),
                           cake.__version__)}
    try:
        import fla
        from fla.ops.kda import chunk_kda as fla_kda
        arms["fla"] = (fla_kda, getattr(fla, "__version__", "?"))
    except Exception as e:  # noqa: BLE001 - report and go on without the arm
        print(f"flash-linear-attention unavailable: {e}", file=sys.stderr)
    arms["cake_control"] = arms["cake"]
    return arms


def make_inputs(docs, H, HV, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(docs)
    kw = dict(device="cuda", generator=gen)
    q = F.normalize(torch.randn(1, T, H, K, **kw), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, H, K, **kw), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    g = -5.0 * torch.rand(1, T, HV, K, **kw)
    beta = torch.rand(1, T, HV, **kw).bfloat16()
    cu = torch.tensor([0] + docs, device="cuda").cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    return (q, k, v, g, beta), cu, do


def peak_extra_bytes(run):
    """The peak memory one call allocates beyond what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def shapes(workload, heads, spec):
    if workload == "P4":
        docs = spec["kda"]["single_gpu"]["P4"]["docs"]
        return [(f"P4_H{h}", docs, h, h) for h in heads]
    if workload == "A":
        docs = spec["gdn"]["single_gpu"]["A"]["docs"]
        return [("A_16x48", docs, 16, 48)]
    raise ValueError(workload)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="+", default=["P4", "A"])
    parser.add_argument("--heads", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--ops", nargs="+", default=["fwd", "fwd+bwd", "ckpt"])
    parser.add_argument("--arms", nargs="+", default=None, help="subset of arms")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    spec = json.loads((HERE / "workloads.json").read_text())
    arms = load_arms()
    if args.arms:
        arms = {n: a for n, a in arms.items() if n in args.arms or n == "cake_control"}
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                commit=os.environ.get("CAKE_COMMIT") or git_commit(), torch=torch.__version__,
                versions={n: a[1] for n, a in arms.items()}, op_name="chunk_kda")
    l2 = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    out = args.out.open("a") if args.out else None
    for wl in args.workloads:
        for name, docs, H, HV in shapes(wl, args.heads, spec):
            inputs, cu, do = make_inputs(docs, H, HV)
            leaves = [t.requires_grad_() for t in inputs]
            for op in args.ops:
                steps = {n: make_step(a[0], op, leaves, cu, do) for n, a in arms.items()}
                per_group = measure(steps, args.groups, args.iters, l2)
                peaks = {n: peak_extra_bytes(s) for n, s in steps.items()}
                cake_ms = statistics.median(per_group["cake"])
                for arm, medians in per_group.items():
                    ms = statistics.median(medians)
                    line = dict(meta, workload=name, op=op, arm=arm, ms=ms,
                                speedup_vs_cake=None if arm.startswith("cake") else ms / cake_ms,
                                peak_extra_gib=peaks[arm] / 2**30,
                                drift=(medians[-1] - medians[0]) / medians[0], groups=medians)
                    if out:
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                    print(f"{name:8s} {op:8s} {arm:13s} {ms:9.3f} ms  "
                          f"{line['peak_extra_gib']:6.2f} GiB"
                          + ("" if line["speedup_vs_cake"] is None
                             else f"   cake is {line['speedup_vs_cake']:.2f}x faster"), flush=True)
                control = statistics.median(per_group["cake_control"]) / cake_ms
                print(f"{name:8s} {op:8s} control ratio {control:.3f} (accept 0.98-1.02)",
                      flush=True)
                del steps
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
