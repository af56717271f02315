"""One forward + backward of cake's GDN on a workload of bench/workloads.json, for Nsight Compute.

    ncu --clock-control none -k regex:'_kernel$' python3 tools/profile_gdn.py --workload M

Warm-up runs once first (module load, allocator), then the profiled step runs once.
"""

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from bench_gdn import make_inputs, make_step  # noqa: E402

import cake  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="M")
    parser.add_argument("--save-for-backward", default=None,
                        help="saved, inverse or recompute (default: cake's default mode)")
    args = parser.parse_args()
    spec = json.loads((HERE.parent / "bench" / "workloads.json").read_text())["gdn"]["single_gpu"]
    w = spec[args.workload]
    inputs, cu, do = make_inputs(w["docs"], w["heads_qk"], w["heads_v"])
    gdn = functools.partial(cake.chunk_gated_delta_rule, save_for_backward=args.save_for_backward)
    step = make_step(gdn, "fwd+bwd", [t.requires_grad_() for t in inputs], cu, do)
    for _ in range(2):
        step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
