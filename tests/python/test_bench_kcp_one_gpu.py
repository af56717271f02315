"""The one-GPU context-parallel benchmark's harness, run on the CPU (FP64, tiny packs): every
rank's step replayed alone from its recorded all-gathers gives the recorded outputs bitwise (the
benchmark raises otherwise), and its lines carry what docs/perf-notes.md reads from them."""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_kcp_one_gpu  # noqa: E402


def test_cpu_smoke_run_replays_every_rank_exactly(tmp_path):
    out = tmp_path / "kcp1.jsonl"
    lines = bench_kcp_one_gpu.main(
        ["--device", "cpu", "--packs", "P5", "D256K", "--worlds", "1", "3", "--layouts",
         "zigzag_per_document", "--segments", "0", "2", "--groups", "1", "--iters", "1",
         "--out", str(out)])
    # P5 and D256K x (W = 1 contiguous, W = 3 one layout) x 2 segment settings x 2 ops
    assert len(lines) == 16 and len(out.read_text().splitlines()) == 16
    for line in lines:
        assert len(line["rank_ms"]) == len(line["local_ms"]) == len(line["P"]) == line["W"]
        assert all(math.isfinite(x) and x > 0 for x in line["rank_ms"] + [line["single_ms"]])
        if line["segments"] == 2:
            assert set(line["P"]) == {2}
        forward = line["exchange_bytes"]["forward_send"]
        assert forward > 0  # the header travels even when no record does
        if line["W"] > 1 and line["workload"] == "D256K":
            assert line["exchange_bytes"]["forward_receive"] == (line["W"] - 1) * forward
        if line["op"] == "fwd":
            assert line["exchange_bytes"]["backward_send"] == 0
