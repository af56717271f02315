"""One forward + backward of the causal conv1d of each arm (cake, FLA's Triton kernels), for
Nsight Compute: the arms run twice unprofiled first (module load, FLA's autotuning, the
allocator), then once each between cudaProfilerStart and cudaProfilerStop, so that

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        python3 tools/profile_conv1d.py --pack A --dim 2048

profiles exactly one forward and one backward of each arm, on bench_conv1d.py's inputs (the
documents of a GDN workload, W = 4, bf16 x, SiLU).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from bench_conv1d import Step, load_arms, make_inputs  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", default="A", help="a GDN workload of bench/workloads.json")
    parser.add_argument("--dim", type=int, default=2048, help="channels D")
    parser.add_argument("--width", type=int, default=4, help="W")
    parser.add_argument("--arms", nargs="+", default=["cake", "fla"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    spec = json.loads((HERE.parent / "bench" / "workloads.json").read_text())
    docs = spec["gdn"]["single_gpu"][args.pack]["docs"]
    arms = load_arms()
    missing = [a for a in args.arms if a not in arms]
    if missing:
        parser.error(f"arms not available here: {missing} (available: {sorted(arms)})")
    leaves, cu, seq_idx, dy = make_inputs(docs, args.dim, args.width)
    leaves = [t.requires_grad_() for t in leaves]
    steps = {a: Step(arms[a][0], "fwd+bwd", leaves, cu, seq_idx, dy) for a in args.arms}
    for _ in range(2):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, step in steps.items():
        torch.cuda.nvtx.range_push(name)
        step()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
