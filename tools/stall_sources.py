"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

    python3 tools/stall_sources.py walks_sass.csv [--kernel walk_a_bwd] [--top 30]

The input is `ncu -i REPORT --page source --csv --print-source sass` of a report with the
SourceCounters section (tools/device_check.sh, stage "sources"). Per kernel it prints the
instructions with the most warp-stall samples and their main reasons, the samples by reason, and
the barrier waits attributed to the barrier: Nsight counts a warp waiting at a bar.sync (or a
wgmma wait) on the instruction after it, so each "barrier" sample is charged to the nearest
barrier instruction before. Offsets are from the kernel's first instruction, as nvdisasm prints
them for the cubin of the same build. Samples are over all of a CTA's warps: with two roles of
equal size, a role's share of its own time is twice its share here.
"""

import argparse
import collections
import csv
import re
import sys

ALL = "Warp Stall Sampling (All Samples)"
BARRIER = re.compile(r"BAR\.|WARPGROUP\.DEPBAR|DEPBAR|WARPSYNC")


def kernels(path):
    """[(name, header, rows)] of the source page's CSV (one block per kernel)."""
    out = []
    for row in csv.reader(open(path, newline="")):
        if len(row) >= 2 and row[0] == "Kernel Name":
            out.append([row[1], None, []])
        elif row and row[0] == "Address" and out:
            out[-1][1] = row
        elif row and row[0].startswith("0x") and out:
            out[-1][2].append(row)
    return out


def report(name, header, rows, top):
    col = {n: i for i, n in enumerate(header)}
    reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    base = int(rows[0][0], 16)
    offset = [int(r[0], 16) - base for r in rows]
    sass = [r[1].strip() for r in rows]
    samples = [int(r[col[ALL]] or 0) for r in rows]
    by_reason = [{n[len("stall_"):]: int(r[col[n]] or 0) for n in reasons} for r in rows]
    total = sum(samples) or 1
    print(f"{name}\n  {len(rows)} instructions, {total} samples")
    print("  by reason:", ", ".join(
        f"{k} {100 * v / total:.1f}%" for k, v in
        sum((collections.Counter(x) for x in by_reason), collections.Counter()).most_common(8)))
    print("  instructions with the most samples (offset, samples, share, instruction, reasons):")
    for i in sorted(range(len(rows)), key=lambda i: -samples[i])[:top]:
        main = sorted(by_reason[i].items(), key=lambda x: -x[1])[:2]
        print(f"    {offset[i]:#07x} {samples[i]:8d} {100 * samples[i] / total:5.1f}%  "
              f"{sass[i][:60]:60s} {', '.join(f'{k} {v}' for k, v in main)}")
    waits = collections.Counter()
    for i in range(len(rows)):
        if by_reason[i].get("barrier"):
            j = i - 1
            while j >= 0 and not BARRIER.search(sass[j]):
                j -= 1
            waits[j] += by_reason[i]["barrier"]
    print("  barrier waits, charged to the barrier before (offset, samples, share, instruction):")
    for j, n in waits.most_common(top // 2):
        where = sass[j][:60] if j >= 0 else "?"
        print(f"    {offset[j]:#07x} {n:8d} {100 * n / total:5.1f}%  {where}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="a substring of the kernels' names")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    found, seen = [], set()
    for name, header, rows in kernels(args.csv):
        key = (name, rows[0][0] if rows else None)  # ncu can print a kernel's page twice
        if args.kernel in name and key not in seen:
            seen.add(key)
            found.append((name, header, rows))
    if not found:
        sys.exit(f"no kernel matching {args.kernel!r} in {args.csv}")
    for name, header, rows in found:
        report(name, header, rows, args.top)


if __name__ == "__main__":
    main()
