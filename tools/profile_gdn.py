"""One forward + backward of cake's GDN on a workload of bench/workloads.json, for Nsight Compute.

    ncu --clock-control none -k regex:'_kernel$' python3 tools/profile_gdn.py --workload M

Warm-up runs once first (module load, allocator), then the profiled step runs once.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from bench_gdn import make_inputs  # noqa: E402

import cake  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="M")
    parser.add_argument("--save-for-backward", default="recompute")
    args = parser.parse_args()
    spec = json.loads((HERE.parent / "bench" / "workloads.json").read_text())["gdn"]["single_gpu"]
    w = spec[args.workload]
    (q, k, v, g, beta), cu, do = make_inputs(w["docs"], w["heads_qk"], w["heads_v"])
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta)]
    for _ in range(2):
        o, _ = cake.chunk_gated_delta_rule(*leaves, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                           save_for_backward=args.save_for_backward)
        o.backward(do)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
