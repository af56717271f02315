"""The one-GPU context-parallel benchmark's harness, run on the CPU (FP64, tiny packs): every
rank's step replayed alone from its recorded all-gathers gives the recorded outputs bitwise (the
benchmark raises otherwise), and its lines carry what docs/perf-notes.md reads from them."""

import math

from conftest import import_bench

bench_kcp_one_gpu = import_bench("bench_kcp_one_gpu")


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
        assert line["o_rel_rms_vs_single"] < 1e-12  # FP64: the ranks give the pack's o
        if line["segments"] == 2:
            assert set(line["P"]) == {2}
        forward = line["exchange_bytes"]["forward_send"]
        assert forward > 0  # the header travels even when no record does
        if line["W"] > 1 and line["workload"] == "D256K":
            assert line["exchange_bytes"]["forward_receive"] == (line["W"] - 1) * forward
        if line["op"] == "fwd":
            assert line["exchange_bytes"]["backward_send"] == 0


def test_measure_visits_the_arms_in_palindromic_order():
    """bench_gdn's measure (which this harness times with): one untimed call per arm, then per
    group the arms forward and back (a, b, c, c, b, a), iters timed calls per visit; each
    group's median per arm."""
    calls, visits = [], []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = (float(n * n) for n in range(1, 1000))

    def timer(run, l2):  # a recording timer: which arm, and the n-th call takes n^2 ms
        run()
        visits.append(calls[-1])
        return next(times)

    per_group = bench_kcp_one_gpu.measure(steps, groups=2, iters=2, l2=None, time=timer)
    assert calls[:3] == ["a", "b", "c"]  # the untimed calls, before any timed one
    group = [name for name in "abccba" for _ in range(2)]
    assert visits == group + group
    # group 1: a timed by calls 1, 2, 11, 12 -> 1, 4, 121, 144 ms, median 62.5 (mean 67.5)
    assert per_group == {"a": [62.5, 362.5], "b": [48.5, 348.5], "c": [42.5, 342.5]}


def test_a_cells_drift_is_the_largest_change_of_an_arm(monkeypatch):
    """drift: the largest relative change of an arm's median from the first group to the last
    (measure's per-group medians faked: the single-GPU arm 50 % slower at the end, a local walk
    20 % faster); the cell's other figures come from the same medians."""
    fake = {"rank0": [2.0, 2.0], "rank1": [4.0, 4.0], "local0": [1.0, 0.8], "local1": [3.0, 3.0],
            "single": [4.0, 6.0], "control": [2.2, 2.2]}

    def measure(arms, groups, iters, l2, time):
        assert set(arms) == set(fake) and groups == 2
        for run in arms.values():
            run()
        return {name: fake[name] for name in arms}

    monkeypatch.setattr(bench_kcp_one_gpu, "measure", measure)
    (line,) = bench_kcp_one_gpu.main(
        ["--device", "cpu", "--packs", "P5", "--worlds", "2", "--layouts", "zigzag",
         "--segments", "0", "--ops", "fwd", "--groups", "2", "--iters", "1"])
    assert line["drift"] == 0.5
    assert line["rank_ms"] == [2.0, 4.0] and line["local_ms"] == [0.9, 3.0]
    assert line["slowest_rank_ms"] == 4.0 and line["single_ms"] == 5.0
    assert line["efficiency"] == 5.0 / (2 * 4.0) and line["overhead_ms"] == [2.0 - 0.9, 1.0]
    assert line["control_ratio"] == 2.2 / 2.0


def test_the_batched_arm_times_plans_without_runs(monkeypatch):
    """--batched-arm: each rank also timed on call plans built with no span long (every span's
    products batched), beside plans where every span is long (the threshold forced to one row);
    the threshold is restored after."""
    from cake.kcp import plan
    monkeypatch.setattr(plan, "LONG_SPAN_ROWS", 1)
    seen = []
    products = plan.span_products

    def recording(spans, num_tokens, device):
        made = products(spans, num_tokens, device)
        seen.append((plan.LONG_SPAN_ROWS, len(made.runs), len(made.batches)))
        return made

    monkeypatch.setattr(plan, "span_products", recording)
    (line,) = bench_kcp_one_gpu.main(
        ["--device", "cpu", "--packs", "P5", "--worlds", "2", "--layouts", "zigzag",
         "--segments", "1", "--ops", "fwd+bwd", "--groups", "1", "--iters", "1",
         "--batched-arm"])
    assert len(line["batched_rank_ms"]) == 2
    assert line["batched_slowest_rank_ms"] == max(line["batched_rank_ms"]) > 0
    assert line["o_rel_rms_batched_vs_in_place"] < 1e-12  # FP64: the same o either way
    assert {threshold for threshold, _, _ in seen} == {1, 1 << 62}
    assert all(runs == 0 for threshold, runs, _ in seen if threshold > 1)
    assert all(batches == 0 for threshold, _, batches in seen if threshold == 1)
    assert any(runs for _, runs, _ in seen)
    assert plan.LONG_SPAN_ROWS == 1
