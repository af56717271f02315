"""Layer benchmark: one GatedDeltaNet or KimiDeltaAttention layer of cake against the same layer of
flash-linear-attention 0.6.0, loaded with the same weights, forward + backward on a packed batch
under bf16 autocast, side by side in one run; and where each arm's time goes, kernel by kernel.

    python bench/bench_layers.py --layers gdn kda --out results.jsonl

Why: the main job (python -m cake.train) times whole training steps, where the layers share the
step with the MLPs, norms and the optimizer; this isolates the layer, whose every part (the
projections, the short convolutions, the op, the output norm) either library may do differently,
and its kernel table says which part costs what.

Protocol (bench/workloads.json, "timing_protocol"), as bench/bench_gdn.py: CUDA events; L2
flushed and the device synchronised before every timed iteration; per cell one untimed call per
arm, then groups that visit the arms in palindromic order with several timed iterations per
visit; a cell is the median over groups of each group's median; a control arm (cake again)
measures noise; drift is the change of an arm's median between the first and the last group.
Peak memory: the allocator's peak over one call beyond what was allocated before it (the
layer's parameters and input included in neither arm). Agreement: FLA's output and input and
parameter gradients against cake's, relative RMS, once per cell.

Arms: "cake", "cake_segments" (the same layer given cu_seqlens_cpu, with which the op walks few
long documents as exact segments where cake's plan predicts a gain), "cake_saved" (GDN: a twin
with the same weights in save_for_backward="saved" mode), "fla" and "cake_control".
Cells: layers ("gdn", "kda") x ops ("fwd": the forward with autograd recording; "fwd+bwd").
The batch: the documents of a GDN workload (default M: 32,768 tokens in 5 documents, where cake's
plan cuts 11 segments at 8 value heads) or of --docs (a batch of the main job: 4-6 documents of
at most 8,192 tokens, 4 segments) packed in one row with cu_seqlens, the layer's shape that of the
main job's GPU model (hidden 1024, 4 q/k heads, 8 value heads, head dim 128, expand_v 1). One JSON
line per cell and arm, each with `kernels_ms`: the arm's time per kernel of one call
(bench/kernel_times.py; one run after a warm-up, L2 not flushed: the shares, not the cell's time).
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
from bench_gdn import git_commit, measure, peak_bytes, rel_rms, steps_that_run  # noqa: E402
from kernel_times import kernel_times  # noqa: E402
from kernel_times import summary as kernel_summary  # noqa: E402

OPS = ("fwd", "fwd+bwd")


def make_layer(library: str, kind: str, args):
    """A layer of `library` ("cake" or "fla") on the GPU in fp32 parameters, as models keep them
    under autocast."""
    if library == "cake":
        from cake import layers
    else:
        from fla import layers
    cls = layers.GatedDeltaNet if kind == "gdn" else layers.KimiDeltaAttention
    return cls(hidden_size=args.d_model, expand_v=1, head_dim=args.head_dim,
               num_heads=args.heads, num_v_heads=args.v_heads, layer_idx=0).cuda()


def load_arms(kind: str, args):
    """name -> (layer, version, extra forward keywords): cake's layer, the same given the host
    copy of cu_seqlens (cake_segments: exact segments where cake's plan predicts a gain), a twin
    in saved mode (cake_saved, GDN: the forward keeps the whole saved set, h per chunk included,
    so that the backward walks once: time against memory), FLA's with cake's weights, and cake's
    control."""
    import cake
    torch.manual_seed(0)
    cake_layer = make_layer("cake", kind, args)
    arms = {"cake": (cake_layer, cake.__version__, {}),
            "cake_segments": (cake_layer, cake.__version__, {"cu_seqlens_cpu": True})}
    if kind == "gdn":  # (cake's KDA layer has no save_for_backward of its own)
        saved_layer = make_layer("cake", kind, args)
        saved_layer.load_state_dict(cake_layer.state_dict())
        saved_layer.save_for_backward = "saved"
        arms["cake_saved"] = (saved_layer, cake.__version__, {})
    try:
        import fla
        fla_layer = make_layer("fla", kind, args)
        fla_layer.load_state_dict(cake_layer.state_dict())  # the same names: the same weights
        arms["fla"] = (fla_layer, getattr(fla, "__version__", "?"), {})
    except Exception as e:  # noqa: BLE001 - report and go on without the arm
        print(f"flash-linear-attention's {kind} layer unavailable: {e!r}", file=sys.stderr)
    arms["cake_control"] = arms["cake"]
    return arms


class Step:
    """One call of a layer: forward (with autograd recording) or forward + backward of
    sum(o * do), the input's and the parameters' gradients dropped after each call. With
    host_offsets the layer also gets cu_seqlens_cpu (copied to the host once, here)."""

    def __init__(self, layer, op, x, cu, do, host_offsets=False):
        self.layer, self.op, self.x, self.cu, self.do = layer, op, x, cu, do
        self.extra = {"cu_seqlens_cpu": cu.cpu()} if host_offsets else {}

    def forward(self):
        with torch.autocast(self.x.device.type, dtype=torch.bfloat16, enabled=self.x.is_cuda):
            o, _, _ = self.layer(self.x, cu_seqlens=self.cu, **self.extra)
        return o

    def __call__(self):
        o = self.forward()
        if self.op == "fwd+bwd":
            o.backward(self.do)
        self.x.grad = None
        self.layer.zero_grad(set_to_none=True)


def gradients(layer, x, cu, do, host_offsets=False) -> dict:
    """The output and the gradients of one forward + backward: {"o", "dx", "d<parameter>"}, in
    fp32 (fp64 stays fp64)."""
    o = Step(layer, "fwd+bwd", x, cu, do, host_offsets).forward()
    o.backward(do)
    wide = torch.promote_types(o.dtype, torch.float32)
    grads = {"o": o.detach().to(wide), "dx": x.grad.to(wide)}
    grads.update({f"d{n}": p.grad.to(wide) for n, p in layer.named_parameters()
                  if p.grad is not None})
    x.grad = None
    layer.zero_grad(set_to_none=True)
    return grads


def agreement(arms, x, cu, do):
    """{arm: {tensor: rel-RMS against cake}} of every arm but cake and its control: the output, dx
    and the gradient of each parameter both layers have (the same names: FLA's state dict loads); a
    string where the arm failed."""
    reference = gradients(arms["cake"][0], x, cu, do)
    results = {}
    for name, (layer, _, extra) in arms.items():
        if name in ("cake", "cake_control"):
            continue
        try:
            grads = gradients(layer, x, cu, do, "cu_seqlens_cpu" in extra)
        except Exception as e:  # noqa: BLE001 - a baseline's failure is reported, not raised
            results[name] = f"not compared: {type(e).__name__}: {e}"
            x.grad = None
            continue
        results[name] = {t: rel_rms(g, reference[t]) for t, g in grads.items() if t in reference}
    return results


def describe(errors) -> str:
    """o, dx and the parameter gradient farthest from cake's, on one line."""
    if isinstance(errors, str):
        return errors
    params = {t: e for t, e in errors.items() if t not in ("o", "dx")}
    worst = max(params, key=params.get) if params else None
    return (f"o {errors['o']:.2e}  dx {errors['dx']:.2e}" +
            (f"  worst parameter gradient {worst} {params[worst]:.2e}" if worst else ""))


def parse_args(argv=None):
    spec = json.loads((HERE / "workloads.json").read_text())
    packs = spec["gdn"]["single_gpu"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", default=["gdn", "kda"], choices=("gdn", "kda"))
    parser.add_argument("--pack", default="M", choices=sorted(packs),
                        help="the documents of this GDN workload, packed in one row")
    parser.add_argument("--docs", nargs="+", type=int, default=None,
                        help="document lengths instead of --pack's (e.g. a batch of the main "
                             "job: 8192 8192 7082 4933 3259 1110)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--v-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.docs is None:
        args.docs = packs[args.pack]["docs"]
    else:
        args.pack = "docs"
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_layers: needs a CUDA device")
    l2 = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    out = args.out.open("a") if args.out else None
    tokens = sum(args.docs)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, tokens, args.d_model, device="cuda", generator=gen).requires_grad_()
    do = torch.randn(1, tokens, args.d_model, device="cuda", generator=gen).bfloat16()
    cu = torch.tensor([0] + args.docs, device="cuda").cumsum(0).to(torch.int32)
    shape = dict(pack=args.pack, tokens=tokens, d_model=args.d_model, heads=args.heads,
                 v_heads=args.v_heads, head_dim=args.head_dim)
    for kind in args.layers:
        arms = load_arms(kind, args)
        meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                    commit=os.environ.get("CAKE_COMMIT") or git_commit(),
                    torch=torch.__version__, versions={n: a[1] for n, a in arms.items()},
                    layer=kind, **shape)
        against_cake = agreement(arms, x, cu, do)
        for name, errors in against_cake.items():
            print(f"{kind} {name} vs cake: {describe(errors)}", flush=True)
        for op in args.ops:
            steps = {n: Step(a[0], op, x, cu, do, "cu_seqlens_cpu" in a[2])
                     for n, a in arms.items()}

            def skip(arm, error, kind=kind, op=op):
                print(f"{kind} {op:7s} {arm} skipped: {error!r}", flush=True)
                if out:
                    out.write(json.dumps(dict(meta, op=op, arm=arm, ms=None,
                                              skipped=repr(error))) + "\n")
                    out.flush()

            # A baseline whose first call fails (a shape its version refuses) is left out.
            steps = steps_that_run(steps, [x], skip)
            # Peaks and kernel tables after the timing: FLA's first calls autotune.
            per_group = measure(steps, args.groups, args.iters, l2)
            cake_ms = statistics.median(per_group["cake"])
            for name, medians in per_group.items():
                ms = statistics.median(medians)
                kernels = kernel_times(steps[name])
                line = dict(meta, op=op, arm=name, ms=ms,
                            speedup_vs_cake=None if name.startswith("cake") else ms / cake_ms,
                            peak_extra_gib=peak_bytes(steps[name]) / 2**30,
                            agreement_with_cake=against_cake.get(name),
                            kernels_ms=kernels,
                            drift=(medians[-1] - medians[0]) / medians[0], groups=medians)
                if out:  # line by line: a run cut short keeps its finished cells
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                ratio = "" if name.startswith("cake") else f"   cake is {ms / cake_ms:.2f}x faster"
                print(f"{kind} {op:7s} {name:13s} {ms:8.3f} ms {line['peak_extra_gib']:6.2f} GiB"
                      f"{ratio}", flush=True)
                if name != "cake_control":
                    print(f"{kind} {op:7s} {name} kernels: {kernel_summary(kernels, top=12)}",
                          flush=True)
            control = statistics.median(per_group["cake_control"]) / cake_ms
            print(f"{kind} {op}: control ratio {control:.3f} (accept 0.98-1.02)", flush=True)
        del arms
        torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
