"""GDN and KDA accuracy of cake next to flash-linear-attention's, on the same inputs.

    python bench/accuracy.py --op gdn --out accuracy.jsonl
    python bench/accuracy.py --op kda --out accuracy.jsonl

For each case of tests/python/test_gpu_gdn.py (edge-length documents, GVA, strong and zero decay,
beta near 0 and 1, subsampled workloads) or of tests/python/test_gpu_kda.py (bounded, unbounded,
split and zero per-channel gates, documents of 1 to 65 tokens, GVA 1 to 4, beta near 0 and 1):
both implementations run forward and backward on the GPU; the FP64 reference (cake's CPU path on
the same inputs, upcast) gives the truth. Printed per output: relative RMS error and max-abs
error / max|ref| of cake and of FLA, and whether cake meets the gate of bench/workloads.json
("no worse than 1.1 x the error of flash-linear-attention"). For GDN, where FlashQLA is
installed, its errors on the same inputs are reported too, as its users call it ("flashqla":
auto_cp=True, whose intra-GPU segments start from a warm-up truncated once the gate has decayed
past e^-10) and exact ("flashqla_nocp": auto_cp=False); they do not enter the gate. Where FLA
fails on a case (printed "failed", null in the JSON line), cake's errors meet the gate's own
bounds alone. For KDA, FLA's Triton kernels run (FLA_DISABLE_BACKEND_DISPATCH=1, as
bench/bench_kda.py times them); every line says whether FLA's dispatch was on.

--seeds N draws each case N times (seeds crc32(case) + 0 .. N - 1) and pools the errors: the
relative RMS over all draws together, the largest max-abs ratio. One draw can mislead: with a
random dht, dg and dbeta are dominated by a document's last few tokens, so one draw's relative
RMS is a statistic of a handful of numbers (docs/perf-notes.md, accuracy at v9).
"""

import argparse
import datetime
import functools
import json
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("FLA_FLASH_QLA", "0")  # FLA's own kernels, not its FlashQLA dispatch

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
import test_gpu_gdn  # noqa: E402
import test_gpu_kda  # noqa: E402

import cake  # noqa: E402


def gdn_cases():
    """name -> (cake's op, FLA's op, make_inputs(seed) -> (inputs, dout, dht), reference, l2)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    cases = {}
    for name, (docs, H, HV, kw, l2) in test_gpu_gdn.CASES.items():
        make = functools.partial(test_gpu_gdn.make_inputs, docs, H, HV, **kw)
        ref = functools.partial(test_gpu_gdn.reference, use_qk_l2norm=l2)
        cases[name] = (cake.chunk_gated_delta_rule, fla_gdn, make, ref, l2)
    return cases


def kda_cases():
    """As gdn_cases, for KDA (the L2 norm in the op, as in its GPU tests)."""
    from fla.ops.kda import chunk_kda as fla_kda
    return {name: (cake.chunk_kda, fla_kda,
                   functools.partial(test_gpu_kda.make_inputs, docs, H, HV, **kw),
                   test_gpu_kda.reference, True)
            for name, (docs, H, HV, kw) in test_gpu_kda.CASES.items()}


def run(fn, inputs, dout, dht, l2):
    """o, final_state and every gradient of fn (FLA's signature) on the GPU, as float64 on the
    CPU."""
    x = {n: None if t is None else t.cuda().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
               output_final_state=True, use_qk_l2norm_in_kernel=l2, cu_seqlens=x["cu_seqlens"])
    torch.autograd.backward([o, ht], [dout.cuda(), dht.cuda()])
    out = {"o": o, "final_state": ht}
    out.update({"d" + n: x[n].grad for n in ("q", "k", "v", "g", "beta")})
    if x["initial_state"] is not None:
        out["dh0"] = x["initial_state"].grad
    return {n: t.detach().double().cpu() for n, t in out.items()}


def run_other(name, fn, inputs, dout, dht, l2):
    """run() for a reported-only implementation: None (and a line on stderr) where it fails on
    the case, so that the comparison goes on without it."""
    try:
        return run(fn, inputs, dout, dht, l2)
    except Exception as e:  # noqa: BLE001
        print(f"{name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def errors(pairs):
    """Pooled errors of (got, ref) pairs: relative RMS over all of them together, the largest
    max-abs error / max|ref| of any one, and whether every value is finite."""
    err2 = sum(float((got - ref).square().sum()) for got, ref in pairs)
    ref2 = sum(float(ref.square().sum()) for _, ref in pairs)
    return dict(rel_rms=(err2 / max(ref2, 1e-60)) ** 0.5,
                max_abs_rel=max(float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                                for got, ref in pairs),
                finite=all(bool(torch.isfinite(got).all()) for got, _ in pairs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=["gdn", "kda"], default="gdn")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cases", nargs="+", default=None, help="default: every case of the op")
    parser.add_argument("--seeds", type=int, default=1, help="draws per case, errors pooled")
    args = parser.parse_args()
    if args.op == "kda":
        # FLA's Triton KDA, as bench_kda.py times it (its dispatch would send equal-head cases to
        # a TileLang backward, minutes of compiling on a fresh machine); read at FLA's import.
        os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    import fla
    cases = gdn_cases() if args.op == "gdn" else kda_cases()
    unknown = sorted(set(args.cases or ()) - set(cases))
    if unknown:
        parser.error(f"--cases: {args.op} has no case {unknown}; it has {sorted(cases)}")
    others = {}  # name -> FlashQLA in its two forms, where installed (GDN only)
    try:
        if args.op == "gdn":
            import flash_qla
            others = {"flashqla": flash_qla.chunk_gated_delta_rule,
                      "flashqla_nocp": functools.partial(flash_qla.chunk_gated_delta_rule,
                                                         auto_cp=False)}
    except Exception as e:  # noqa: BLE001 - report and go on without it
        print(f"FlashQLA unavailable: {e}", file=sys.stderr)
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                op=args.op,
                commit=os.environ.get("CAKE_COMMIT", "unknown"), torch=torch.__version__,
                fla_version=getattr(fla, "__version__", "?"), seeds=args.seeds,
                fla_backend_dispatch=os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") != "1",
                flashqla_version=getattr(sys.modules.get("flash_qla"), "__version__", None))
    out = args.out.open("a") if args.out else None
    print(f"{'case':22s} {'output':12s} {'cake rel_rms':>12s} {'fla rel_rms':>12s} "
          f"{'cake max':>9s} {'fla max':>9s}  gate")
    for case in args.cases or list(cases):
        ours_fn, fla_fn, make_inputs, reference, l2 = cases[case]
        draws = []  # (reference, cake, FLA, {other: results}) per seed
        for seed in range(zlib.crc32(case.encode()), zlib.crc32(case.encode()) + args.seeds):
            inputs, dout, dht = make_inputs(seed=seed)
            draws.append((reference(inputs, dout, dht),
                          run(ours_fn, inputs, dout, dht, l2),
                          run_other("fla", fla_fn, inputs, dout, dht, l2),
                          {n: run_other(n, fn, inputs, dout, dht, l2)
                           for n, fn in others.items()}))
        for name in draws[0][0]:
            e_cake = errors([(ours[name], ref[name].double()) for ref, ours, _, _ in draws])
            # FLA failed on the case: cake's errors against the gate's bounds alone
            e_fla = (errors([(theirs[name], ref[name].double()) for ref, _, theirs, _ in draws])
                     if all(theirs is not None for _, _, theirs, _ in draws) else None)
            e_others = {n: errors([(rest[n][name], ref[name].double())
                                   for ref, _, _, rest in draws])
                        for n in others
                        if all(rest[n] is not None and name in rest[n] for *_, rest in draws)}
            ok = (e_cake["finite"] and e_cake["rel_rms"] <= 1e-2 and e_cake["max_abs_rel"] <= 2e-2
                  and (e_fla is None or e_cake["rel_rms"] <= 1.1 * e_fla["rel_rms"]))
            fla_rms, fla_max = ((f"{e_fla['rel_rms']:12.2e}", f"{e_fla['max_abs_rel']:9.2e}")
                                if e_fla else (f"{'failed':>12s}", f"{'failed':>9s}"))
            print(f"{case:22s} {name:12s} {e_cake['rel_rms']:12.2e} {fla_rms} "
                  f"{e_cake['max_abs_rel']:9.2e} {fla_max}  "
                  f"{'pass' if ok else 'FAIL'}"
                  + "".join(f"  {n} {e['rel_rms']:.2e}" for n, e in e_others.items()), flush=True)
            if out:
                out.write(json.dumps(dict(meta, case=case, output=name, cake=e_cake, fla=e_fla,
                                          gate=ok, **e_others)) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
