"""Bytes that the torch ops of one context-parallel rank's call move, by source line (CPU).

Runs one rank of W = 4 virtual ranks (zigzag_per_document) over a GDN pack, forward and backward,
under a TorchDispatchMode that adds, for every torch op outside views, the bytes of its operands
and results (an index, clone or cast op: its result twice, read and written; an allocation or a
resize_: nothing; a fill with zeros or a value: its result; index_put_: its values twice;
index_fill_: the slices it writes; baddbmm into out: its addend copied into out, then the
product added there). cake's own forward and backward count their operands alone,
not the kernels' traffic. Each op is charged to the innermost line
of python/cake/kcp that issued it.

The pack is scaled down twice (the token counts divided by --scale and by half of it, the same
documents) so that each line's bytes split into a part per token and a part per document; they
are then scaled back to the pack's tokens and to --heads value heads (q/k heads HV / 3). The
plan's long-span threshold (LONG_SPAN_ROWS) is scaled with the tokens, so that a span takes
its products as it would at full scale. Only proportions and bytes are meaningful: the CPU runs
the FP64 reference, nothing is timed.

    python tools/kcp_bytes.py --pack P1 --segments 1
"""

import argparse
import collections
import contextlib
import json
import pathlib
import traceback

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import cake.kcp as kcp
from cake.kcp import plan as kcp_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
VIEWS = {"view", "_unsafe_view", "transpose", "expand", "slice", "select", "as_strided", "t",
         "alias", "unsqueeze", "squeeze", "permute", "detach", "reshape", "_reshape_alias",
         "split", "unbind", "lift_fresh"}
COPIES = {"index", "index_select", "gather", "clone", "_to_copy", "copy_"}
ALLOCATIONS = {"empty", "empty_like", "new_empty", "resize_"}
FILLS = {"zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full"}
OUTSIDE = "(outside cake.kcp)"
W, K, V, HV_RUN = 4, 128, 128, 3


def _bytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


class ByteCount(TorchDispatchMode):
    """Bytes per (source line, op) of the ops run inside it."""

    def __init__(self):
        super().__init__()
        self.bytes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in VIEWS:
            return out
        operands = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        result = sum(_bytes(x) for x in tree_flatten(out)[0])
        if name in ALLOCATIONS:
            moved = 0
        elif name in FILLS:
            moved = result
        elif name in COPIES:
            moved = 2 * result
        elif name == "index_put_":  # the values read, then written
            moved = 2 * _bytes(operands[-1])
        elif name == "index_fill_":  # the indexed slices written
            x, dim, index = args[0], args[1], args[2]
            moved = _bytes(x) // max(1, x.shape[dim]) * index.numel()
        elif func.__name__ == "baddbmm.out":  # out written twice: the addend's copy, the sum
            moved = sum(_bytes(x) for x in operands) + 2 * result
        else:
            moved = sum(_bytes(x) for x in operands) + result
        # The innermost frame of cake.kcp or of this script (the loss and its gradient).
        frames = [f for f in traceback.extract_stack()[:-1]
                  if "cake/kcp" in f.filename or f.filename == __file__]
        where = (f"{frames[-1].filename.split('cake/')[-1]}:{frames[-1].lineno}"
                 if frames and frames[-1].filename != __file__ else OUTSIDE)
        self.bytes[(where, func.__name__)] += moved
        return out


def one_rank(docs: list[int], segments: int, long_rows: int,
             rank: int = 1) -> tuple[int, int, collections.Counter]:
    """(T_local, the rank's segments, bytes per (line, op)) of rank `rank`'s forward +
    backward, spans of long_rows rows or more taking their products in place."""
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    T, H = int(cu[-1]), HV_RUN // 3
    gen = torch.Generator().manual_seed(0)
    t = dict(q=torch.randn(1, T, H, K, generator=gen).bfloat16(),
             k=torch.randn(1, T, H, K, generator=gen).bfloat16(),
             v=torch.randn(1, T, HV_RUN, V, generator=gen).bfloat16(),
             g=F.logsigmoid(torch.randn(1, T, HV_RUN, generator=gen) + 3),
             beta=torch.rand(1, T, HV_RUN, generator=gen))
    do = torch.randn(1, T, HV_RUN, V, generator=gen).bfloat16()
    count = ByteCount()

    def run(exchange):
        ctx = kcp.build_context(cu, exchange=exchange, layout="zigzag_per_document",
                                segments=segments)
        local = {n: kcp.shard(x, ctx).requires_grad_() for n, x in t.items()}
        do_local = kcp.shard(do, ctx)
        with count if exchange.rank == rank else contextlib.nullcontext():
            o, _ = kcp.chunk_gated_delta_rule_kcp(*local.values(), ctx,
                                                  use_qk_l2norm_in_kernel=True)
            o.backward(do_local)
        plan = ctx.call_plan(segments, False, True, torch.device("cpu"))
        return ctx.num_tokens, plan.num_segments

    default, kcp_plan.LONG_SPAN_ROWS = kcp_plan.LONG_SPAN_ROWS, long_rows
    try:
        tokens, num_segments = kcp.VirtualWorld(W, timeout=900).run(run)[rank]
    finally:
        kcp_plan.LONG_SPAN_ROWS = default
    return tokens, num_segments, count.bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", default="P1", help="a GDN context-parallel pack (P1-P5)")
    parser.add_argument("--segments", type=int, default=1,
                        help="segments per fragment, >= 1 (the plan rule's choice depends on the "
                        "head count, which the tool scales)")
    parser.add_argument("--scale", type=int, default=64, help="token counts divided by this")
    parser.add_argument("--heads", type=int, default=48, help="value heads to scale to")
    parser.add_argument("--rows", type=int, default=20, help="lines to print")
    args = parser.parse_args()
    if args.segments < 1:
        parser.error(f"--segments must be >= 1, got {args.segments}")
    packs = json.loads((ROOT / "bench" / "workloads.json").read_text())
    docs = packs["gdn"]["context_parallel"]["packs"][args.pack]
    small, large = (one_rank([max(1, d // s) for d in docs], args.segments,
                             max(1, kcp_plan.LONG_SPAN_ROWS // s))
                    for s in (args.scale, args.scale // 2))
    (t1, s1, b1), (t2, s2, b2) = small, large
    if s1 != s2:  # a fragment of few chunks takes fewer segments: the split would be wrong
        raise SystemExit(f"the rank walks {s1} segments at 1/{args.scale} and {s2} at "
                         f"1/{args.scale // 2} of the pack: pass a smaller --scale")
    t_real = t2 * args.scale // 2  # the rank's tokens at full scale, near enough
    heads = args.heads / HV_RUN
    rows = []
    for key in set(b1) | set(b2):
        per_token = (b2[key] - b1[key]) / (t2 - t1)
        fixed = b1[key] - per_token * t1
        rows.append((heads * (fixed + per_token * t_real), heads * fixed, key))
    rows.sort(reverse=True)
    ours = [r for r in rows if r[2][0] != OUTSIDE]
    total = sum(r[0] for r in ours)
    print(f"{args.pack}, W = {W}, P = {args.segments}: rank 1 of ~{t_real} tokens at "
          f"{args.heads} value heads: {total / 1e9:.1f} GB in cake.kcp's torch ops "
          f"(~{total / 3e12 * 1e3:.1f} ms at 3 TB/s)")
    for total_b, fixed_b, (where, op) in ours[:args.rows]:
        print(f"{total_b / 1e9:7.2f} GB (per document {fixed_b / 1e9:5.2f})  {op:32s} {where}")


if __name__ == "__main__":
    main()
