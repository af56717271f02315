"""Causal conv1d benchmark: cake against flash-linear-attention's Triton causal_conv1d and the
causal-conv1d package's CUDA kernels, side by side in one run, with the achieved bandwidth
against the copy roofline.

    python bench/bench_conv1d.py --packs A M --channels 2048 6144 --widths 4 --out results.jsonl

Protocol (bench/workloads.json, "timing_protocol"), as bench/bench_gdn.py: CUDA events; L2
flushed and the device synchronised before every timed iteration; per cell one untimed call per
arm, then groups that visit the arms in palindromic order with several timed iterations per
visit; a cell is the median over groups of each group's median; a control arm (cake again)
measures noise; drift is the change of an arm's median between the first and the last group. The
GPU sleeps ~0.2 ms before each start event, so that the op's launches are queued when the clock
starts (time_step): the cells are ~0.1-1 ms, and the host's dispatch would count otherwise.

Cells: packs (the documents of GDN workloads, "conv1d" in bench/workloads.json) x channels D
(16 x 128 for q or k, 48 x 128 for v) x widths x ops. Ops: "fwd" (forward with autograd
recording), "bwd" (the backward of a forward run untimed before it), "fwd+bwd". bf16 x, fp32
weight and bias, SiLU, packed documents; no states (the causal-conv1d package takes none with
packed documents).

Roofline: the least bytes an op must move (fwd: read x, write y; bwd: read dy and x, write dx;
fwd+bwd: both) over the copy bandwidth measured the same way (a bf16 tensor of T x D copied);
`roofline_ratio` = ms / (bytes / copy bandwidth), the issue's bar being <= 1.3. Peak memory: the
allocator's peak over one call of the op beyond what its inputs hold (the backward's after its
forward). Agreement: each baseline's y and dx against cake's, relative RMS, once per inputs. One
JSON line per cell and arm.

Arms: "cake" (cake.causal_conv1d); "fla" (flash-linear-attention's causal_conv1d,
backend="triton"); "causal_conv1d" (causal_conv1d_fn on the channel-last view, packed documents
through seq_idx); "cake_control" (cake again).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_gdn  # noqa: E402
from bench_gdn import chosen_arms, flush_l2, git_commit, peak_bytes, steps_that_run  # noqa: E402
from bench_gdn import measure as measure_calls  # noqa: E402

OPS = ("fwd", "bwd", "fwd+bwd")
ACTIVATION = "silu"


def load_arms():
    """name -> (function(x, weight, bias, cu_seqlens, seq_idx) -> y [1, T, D], version)."""
    import cake
    arms = {"cake": (lambda x, w, b, cu, seq_idx: cake.causal_conv1d(
        x, w, b, activation=ACTIVATION, cu_seqlens=cu)[0], cake.__version__)}
    try:
        import fla
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
        arms["fla"] = (lambda x, w, b, cu, seq_idx: fla_conv(
            x, w, b, activation=ACTIVATION, backend="triton", cu_seqlens=cu)[0],
            getattr(fla, "__version__", "?"))
    except Exception as e:  # noqa: BLE001 - report and go on without the arm
        print(f"flash-linear-attention unavailable: {e}", file=sys.stderr)
    try:
        import causal_conv1d
        from causal_conv1d import causal_conv1d_fn
        arms["causal_conv1d"] = (lambda x, w, b, cu, seq_idx: causal_conv1d_fn(
            x.transpose(1, 2), w, b, seq_idx=seq_idx, activation=ACTIVATION).transpose(1, 2),
            getattr(causal_conv1d, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(f"causal-conv1d unavailable: {e}", file=sys.stderr)
    arms["cake_control"] = arms["cake"]
    return arms


def make_inputs(docs, dim, width, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(docs)
    kw = dict(device="cuda", generator=gen)
    x = torch.randn(1, T, dim, dtype=torch.bfloat16, **kw)
    weight = torch.randn(dim, width, **kw) / width
    bias = torch.randn(dim, **kw)
    cu = torch.tensor([0] + docs, device="cuda").cumsum(0).to(torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(len(docs), device="cuda", dtype=torch.int32),
                                      torch.tensor(docs, device="cuda"))[None]
    dy = torch.randn(1, T, dim, dtype=torch.bfloat16, **kw)
    return (x, weight, bias), cu, seq_idx, dy


def agreement_with_cake(arms, leaves, cu, seq_idx, dy):
    """bench_gdn.agreement_with_cake on each arm's y and dx."""
    def y_and_dx(fn):
        x = leaves[0].detach().requires_grad_()
        y = fn(x, *leaves[1:], cu, seq_idx)
        y.backward(dy)
        return {"y": y.detach(), "dx": x.grad}

    return bench_gdn.agreement_with_cake(arms, y_and_dx, leaves)


class Step:
    """One op of one arm: prepare() runs untimed before each timed run() (the bwd op's forward)."""

    def __init__(self, fn, op, leaves, cu, seq_idx, dy):
        self.fn, self.op, self.leaves, self.cu, self.seq_idx, self.dy = (
            fn, op, leaves, cu, seq_idx, dy)
        self.y = None

    def forward(self):
        return self.fn(*self.leaves, self.cu, self.seq_idx)

    def prepare(self):
        if self.op == "bwd":
            self.y = self.forward()

    def run(self):
        if self.op == "fwd":
            self.forward()
        elif self.op == "bwd":
            self.y.backward(self.dy)
            self.y = None
        elif self.op == "fwd+bwd":
            self.forward().backward(self.dy)
        else:
            raise ValueError(self.op)
        for t in self.leaves:
            t.grad = None

    def __call__(self):  # an untimed call: prepare, then run
        self.prepare()
        self.run()


# Cycles the GPU sleeps before each start event (~0.2 ms at the H200's ~2 GHz): the op's launches
# (Python dispatch, autograd, FLA's Triton wrappers: tens of microseconds against cells of ~0.1
# ms) are queued by the time the clock starts, so a cell times the GPU's work, as in a training
# step whose queue is full, not the host's.
LAUNCH_COVER_CYCLES = 400_000


def time_step(step, l2):
    step.prepare()
    flush_l2(l2)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(LAUNCH_COVER_CYCLES)
    start.record()
    step.run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def measure(steps, groups, iters, l2):
    """bench_gdn's palindromic visits, each step's prepare() untimed before its timed run():
    name -> list of per-group medians (ms)."""
    return measure_calls(steps, groups, iters, l2, time=time_step)


def op_bytes(op, tokens, dim, itemsize=2):
    """The least bytes the op moves: fwd reads x and writes y; bwd reads dy and x, writes dx."""
    tensor = tokens * dim * itemsize
    return {"fwd": 2 * tensor, "bwd": 3 * tensor, "fwd+bwd": 5 * tensor}[op]


def copy_bandwidth(tokens, dim, groups, iters, l2):
    """Bytes per ms of a bf16 [tokens, dim] copy (read + write), timed as the arms are."""
    src = torch.randn(tokens, dim, device="cuda").bfloat16()
    dst = torch.empty_like(src)

    class Copy:
        def prepare(self):
            pass

        def run(self):
            dst.copy_(src)

        def __call__(self):
            self.run()

    ms = statistics.median(measure({"copy": Copy()}, groups, iters, l2)["copy"])
    return 2 * src.numel() * src.element_size() / ms


def parse_args(argv=None):
    spec = json.loads((HERE / "workloads.json").read_text())
    conv = spec["conv1d"]
    packs = {p.split(".")[-1]: spec["gdn"]["single_gpu"][p.split(".")[-1]]["docs"]
             for p in conv["packs"]}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packs", nargs="+", default=sorted(packs), choices=sorted(packs))
    parser.add_argument("--channels", nargs="+", type=int,
                        default=sorted(conv["channels"].values()))
    parser.add_argument("--widths", nargs="+", type=int, default=[4],
                        choices=conv["widths"])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--arms", nargs="+", default=None, help="subset of arms")
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.docs = {name: packs[name] for name in args.packs}
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_conv1d: needs a CUDA device")
    arms = chosen_arms(load_arms(), args.arms)
    commit = os.environ.get("CAKE_COMMIT") or git_commit()
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                commit=commit, torch=torch.__version__,
                versions={n: a[1] for n, a in arms.items()})
    l2 = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    out = args.out.open("a") if args.out else None
    for pack, docs in args.docs.items():
        tokens = sum(docs)
        for dim in args.channels:
            copy = copy_bandwidth(tokens, dim, args.groups, args.iters, l2)
            for width in args.widths:
                inputs, cu, seq_idx, dy = make_inputs(docs, dim, width)
                leaves = [t.requires_grad_() for t in inputs]
                against_cake = agreement_with_cake(arms, leaves, cu, seq_idx, dy)
                for arm, errors in against_cake.items():
                    print(f"{pack} D={dim:5d} W={width} {arm} vs cake: " + (
                        errors if isinstance(errors, str)
                        else "  ".join(f"{n} {e:.2e}" for n, e in errors.items())), flush=True)
                for op in args.ops:
                    steps = {n: Step(a[0], op, leaves, cu, seq_idx, dy) for n, a in arms.items()}

                    def skip(arm, error, pack=pack, dim=dim, width=width, op=op):
                        print(f"{pack} D={dim:5d} W={width} {op:7s} {arm} skipped: {error!r}",
                              flush=True)
                        if out:
                            out.write(json.dumps(dict(meta, pack=pack, tokens=tokens, dim=dim,
                                                      width=width, op=op, arm=arm, ms=None,
                                                      skipped=repr(error))) + "\n")
                            out.flush()

                    steps = steps_that_run(steps, leaves, skip)
                    # Peaks after the timing: FLA's first calls autotune, and Triton's
                    # autotuner allocates its own flush buffer through torch's allocator. The
                    # backward's peak starts after its forward (prepare), as its time does.
                    per_group = measure(steps, args.groups, args.iters, l2)
                    peaks = {}
                    for n, s in steps.items():
                        s.prepare()
                        peaks[n] = peak_bytes(s.run)
                    cake_ms = statistics.median(per_group["cake"])
                    roofline_ms = op_bytes(op, tokens, dim) / copy
                    for name, medians in per_group.items():
                        ms = statistics.median(medians)
                        line = dict(meta, pack=pack, tokens=tokens, dim=dim, width=width, op=op,
                                    arm=name, ms=ms,
                                    speedup_vs_cake=None if name.startswith("cake")
                                    else ms / cake_ms,
                                    gb_per_s=op_bytes(op, tokens, dim) / ms / 1e6,
                                    copy_gb_per_s=copy / 1e6, roofline_ratio=ms / roofline_ms,
                                    peak_bytes=peaks[name],
                                    agreement_with_cake=against_cake.get(name),
                                    drift=(medians[-1] - medians[0]) / medians[0],
                                    groups=medians)
                        if out:  # line by line: a run cut short keeps its finished cells
                            out.write(json.dumps(line) + "\n")
                            out.flush()
                        print(f"{pack} D={dim:5d} W={width} {op:7s} {name:13s} {ms:8.3f} ms "
                              f"{line['gb_per_s']:7.0f} GB/s  x{line['roofline_ratio']:.2f} "
                              f"roofline  drift {100 * line['drift']:+.1f}%", flush=True)
                    control = statistics.median(per_group["cake_control"]) / cake_ms
                    print(f"{pack} D={dim} W={width} {op}: control ratio {control:.3f} "
                          f"(accept 0.98-1.02)", flush=True)
                    del steps
                del inputs, leaves
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
