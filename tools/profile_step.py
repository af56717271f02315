"""Where a training step of the main job goes, for cake's layers and FLA's: the step's wall time,
the host's time to issue it, the GPU's busy time (the sum of its kernels, memsets and copies) and
the kernels that take the most, from torch.profiler over a few steps after a warm-up.

    python tools/profile_step.py [--impls cake fla] [--steps 4] [--cu-seqlens-cpu]
        [--save-for-backward saved] [--out step_profile.json]

Why: the main job's step (107 ms at the GPU defaults on the H100) is longer than the sum of its
layers' kernels measured alone (bench/bench_layers.py) and the MLPs'; a step whose GPU is busy
for most of its wall time is bound by the kernels, one whose host takes as long as the step is
bound by the Python that issues them, and the two call for different work. The model, batches
and optimizer are the main job's (cake.train at the GPU defaults), every impl starting from the
same weights; each impl runs 3 warm-up steps (allocation, autotuning), then --steps steps timed
one by one (wall: from the step's first call to the loss on the host; issue: from the first call
to the end of optimizer.step(), before the host waits), then one profiled step.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from bench_gdn import git_commit  # noqa: E402
from kernel_times import kernel_times  # noqa: E402

from cake.train.cli import DEFAULTS  # noqa: E402
from cake.train.corpus import batches  # noqa: E402
from cake.train.loop import parameter_groups, train_step  # noqa: E402
from cake.train.model import LanguageModel, ModelConfig  # noqa: E402

import cake  # noqa: E402

WARMUP_STEPS = 3


def one_step(model, optimizer, batch, host_offsets: bool) -> tuple[float, float]:
    """(wall ms, issue ms) of one training step."""
    start = time.perf_counter()
    loss = train_step(model, optimizer, batch, host_offsets)
    issued = time.perf_counter()
    loss.item()
    end = time.perf_counter()
    return (end - start) * 1e3, (issued - start) * 1e3


def model_config(args) -> ModelConfig:
    """The main job's model at its GPU defaults, in args' save_for_backward mode."""
    d = DEFAULTS["cuda"]
    return ModelConfig(layers=tuple(d["layers"].split(",")), d_model=d["d_model"],
                       num_heads=d["heads"], num_v_heads=d["v_heads"], head_dim=d["head_dim"],
                       save_for_backward=args.save_for_backward)


def profile_impl(impl: str, args, weights: dict) -> dict:
    """The result line of impl's model, started from weights."""
    device = torch.device("cuda")
    model = LanguageModel(model_config(args), impl=impl)
    model.load_state_dict(weights)
    model.to(device).train()
    optimizer = torch.optim.AdamW(parameter_groups(model), lr=1e-4, betas=(0.9, 0.95))
    data = batches(DEFAULTS["cuda"]["tokens"], 0)
    step_batches = [next(data).to(device) for _ in range(WARMUP_STEPS + args.steps + 1)]
    for batch in step_batches[:WARMUP_STEPS]:
        one_step(model, optimizer, batch, args.cu_seqlens_cpu)
    torch.cuda.synchronize()
    walls, issues = [], []
    for batch in step_batches[WARMUP_STEPS:-1]:
        wall, issue = one_step(model, optimizer, batch, args.cu_seqlens_cpu)
        walls.append(wall)
        issues.append(issue)
    totals = kernel_times(lambda: one_step(model, optimizer, step_batches[-1],
                                           args.cu_seqlens_cpu), warmup=0)
    return {**header(args), "impl": impl, "wall_ms": statistics.median(walls),
            "issue_ms": statistics.median(issues), "gpu_busy_ms": sum(totals.values()),
            "kernels": len(totals), "top_kernels_ms": dict(list(totals.items())[:args.top]),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "walls": walls}


def header(args) -> dict:
    """What a result line names besides its numbers: date, GPU, commit, versions, settings."""
    versions = {"cake": cake.__version__, "torch": torch.__version__}
    try:
        versions["fla"] = importlib.metadata.version("flash-linear-attention")
    except importlib.metadata.PackageNotFoundError:
        pass
    return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "commit": os.environ.get("CAKE_COMMIT") or git_commit(),
            "tool": "tools/profile_step.py", "versions": versions,
            "model": "cake.train GPU defaults", "cu_seqlens_cpu": args.cu_seqlens_cpu,
            "save_for_backward": args.save_for_backward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["cake", "fla"], choices=("cake", "fla"))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per impl")
    parser.add_argument("--top", type=int, default=25, help="kernels listed per impl")
    parser.add_argument("--cu-seqlens-cpu", action="store_true",
                        help="give cake's layers the host offsets (the segment route)")
    parser.add_argument("--save-for-backward", choices=("inverse", "saved", "recompute"))
    parser.add_argument("--out", type=Path, default=Path("step_profile.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = LanguageModel(model_config(args), impl="cake").state_dict()  # every impl's start
    results = []
    for impl in args.impls:
        r = profile_impl(impl, args, weights)
        results.append(r)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        steps = ", ".join(f"{w:.1f}" for w in r["walls"])
        print(f"{impl}: step {r['wall_ms']:.1f} ms wall (steps {steps}), issued in "
              f"{r['issue_ms']:.1f} ms, GPU busy {r['gpu_busy_ms']:.1f} ms "
              f"({r['gpu_busy_ms'] / r['wall_ms']:.0%}), {r['kernels']} kernel names, "
              f"peak {r['peak_memory_gib']:.2f} GiB")
        for name, ms in r["top_kernels_ms"].items():
            print(f"    {ms:8.3f}  {name[:110]}")
    args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
