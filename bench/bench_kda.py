"""KDA benchmark: cake against flash-linear-attention and cuDNN frontend's Hopper KDA engine, side
by side in one run, with bench_gdn.py's protocol (bench/workloads.json "timing_protocol": CUDA
events, L2 flushed, arms in palindromic order, medians, a control arm) and its JSON lines, plus
each arm's peak extra memory.

    python bench/bench_kda.py --workloads P4 A --ops fwd fwd+bwd ckpt --out results.jsonl

Workloads: "P4" (workloads.json "kda" single_gpu: 4 documents, 261,392 tokens) at H = HV = 4, 16
and 64 (--heads), inputs as workloads.json says (q, k L2-normalised by the caller, g in (-5, 0),
bf16 beta); "A" the grouped shape: GDN workload A's documents with 16 q/k heads and 48 value heads.
--gate in_op gives every arm the raw bf16 g of a layer's projection with the in-op bounded gate
(use_gate_in_kernel, lower_bound=-5, A_log and dt_bias with gradients), as FLA's KDA layer calls
the op; the cudnn arm is left out there (its engine takes activated g only). --g-draw layer draws
the activated g as FLA's KDA layer's bounded gate at initialisation (half the channels slow), so
that state crosses chunks (make_inputs).
Arms: "cake" (the default mode), "cake_saved", "cake_segments" (cake given cu_seqlens_cpu, so that
it walks few long documents as exact segments where its plan predicts a gain; the plan leaves KDA
out, so this arm is the plain op), "cake_kcp_p4" (cake.kcp.chunk_kda_kcp on one rank with every
document cut into 4 exact segments: whether KDA's segments pay now that its chunk pass costs
less than its walks), "cake_kcp_plan" (the same with the P of cake's segment plan, which counts
walk steps only: 16 at P4, H = 4; 4 at H = 16), "fla" (flash-linear-attention's chunk_kda, its
Triton kernels: FLA_DISABLE_BACKEND_DISPATCH=1 unless set otherwise), "fla_safe" (the same with
safe_gate=True: its tensor-core intra-chunk path, valid for gates in [-5, 0)), "cudnn" (cuDNN
frontend's Hopper KDA engine, below), "cake_control".

"cudnn": cudnn.linear_attention.kimi_delta_attention (nvidia-cudnn-frontend 1.32, a torch custom
op with its backward registered) with the plan pinned to the engine "kda_hopper_cuda" (CUDA C++
compiled by NVRTC at the first call: forward one kernel, chunk 16; backward four), so that no
other engine can stand in for it. Our inputs map onto its token-packed layout as views: q, k
[1, T, H, K] -> [T, H, K], v [1, T, HV, V] -> [T, HV, V], g [1, T, HV, K] -> [T, HV, K] (the same
per-key-channel natural-log decay, fp32), beta [1, T, HV] -> [T, HV], cu_seqlens as is, o back
to [1, T, HV, V]. One conversion is inside the timed call: beta bf16 -> fp32 (the engine's
backward takes fp32 g and beta only; FLA and cake read bf16 beta). Scale 1/sqrt(128), the default
of every arm, which its backward fixes; no in-kernel L2 norm or gate (the inputs are normalised
and activated by the caller, as for every arm). Its forward serves grouped value heads, its
backward needs as many q/k heads as value heads: in workload A (16 x 48) it should refuse
"fwd+bwd" and "ckpt". Before timing, per shape, the arm runs its forward, its backward and each
op once (check_cudnn): an op the engine refuses is skipped with the reason printed and in a JSON
line ("skipped"); its output, and its gradients where it has a backward, are compared with
cake's and FLA's (relative RMS, printed and in its JSON lines as "agreement"). Its package is an
opt-in of tools/fetch_device_wheels.sh ("cudnn"); it needs cuda-bindings and NVRTC (torch's
dependencies) and the CUDA headers on the machine.
"""

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gdn  # noqa: E402
from bench_gdn import (PROFILED_ARMS, chosen_arms, git_commit, make_step,  # noqa: E402
                       measure, peak_bytes, rel_rms, steps_that_run, with_host_offsets)
from kernel_times import kernel_times  # noqa: E402
from kernel_times import summary as kernel_summary  # noqa: E402

HERE = Path(__file__).resolve().parent
K = V = 128


def load_arms():
    """name -> (function with FLA's chunk_kda signature, version); missing packages skipped."""
    import cake
    arms = {"cake": (cake.chunk_kda, cake.__version__),
            "cake_saved": (functools.partial(cake.chunk_kda, save_for_backward="saved"),
                           cake.__version__),
            "cake_segments": (with_host_offsets(cake.chunk_kda), cake.__version__),
            "cake_kcp_p4": (kcp_segments(4), cake.__version__),
            "cake_kcp_plan": (kcp_segments(0), cake.__version__)}
    # FLA's own Triton KDA: its dispatch to other backends (TileLang's fused dq/dk/dg backward,
    # taken where q/k and value heads are equal and TileLang is installed) off, read by FLA at its
    # import.
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        import fla
        from fla.ops.kda import chunk_kda as fla_kda
        arms["fla"] = (fla_kda, getattr(fla, "__version__", "?"))
        # FLA's fastest path where the gates are bounded to [-5, 0), as every draw here is:
        # tensor-core products in its intra-chunk kernel (safe_gate; the layer passes it with
        # lower_bound -5).
        arms["fla_safe"] = (functools.partial(fla_kda, safe_gate=True),
                            getattr(fla, "__version__", "?"))
    except Exception as e:  # noqa: BLE001 - report and go on without the arm
        print(f"flash-linear-attention unavailable: {e}", file=sys.stderr)
    try:
        import cudnn
        from cudnn.linear_attention import kimi_delta_attention
        arms["cudnn"] = (functools.partial(cudnn_chunk_kda, kimi_delta_attention),
                         cudnn.__version__)
    except Exception as e:  # noqa: BLE001
        print(f"cuDNN frontend unavailable: {e}", file=sys.stderr)
    arms["cake_control"] = arms["cake"]
    return arms


def kcp_segments(P: int):
    """cake.kcp.chunk_kda_kcp on a one-rank context of the call's documents with P segments
    forced on each (0: the segment plan's P), with chunk_kda's signature. The context is built at the first call with a
    cu_seqlens tensor (the untimed one: it reads the offsets back) and kept."""
    import cake
    contexts = {}

    def call(q, k, v, g, beta, cu_seqlens, **kwargs):
        if id(cu_seqlens) not in contexts:  # the tensor kept beside it: ids stay unique
            num_sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
                       if q.is_cuda else 132)
            ctx = cake.kcp.build_context(cu_seqlens.cpu(), world_size=1, segments=P,
                                         num_sms=num_sms, device=q.device)
            contexts[id(cu_seqlens)] = (cu_seqlens, ctx)
        return cake.kcp.chunk_kda_kcp(q, k, v, g, beta, ctx=contexts[id(cu_seqlens)][1],
                                      **kwargs)
    return call


def cudnn_chunk_kda(kda, q, k, v, g, beta, scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=None):
    """FLA's chunk_kda on cuDNN frontend's kimi_delta_attention (``kda``), pinned to its Hopper
    engine. [B, T, ...] tensors become token-packed [B*T, ...] views; without cu_seqlens, B
    sequences of T tokens. g and beta go in as fp32 because the engine's backward reads nothing
    else. cuDNN's state is V-major, [N, HV, V, K], FLA's K-major: transposed at the boundary."""
    B, T = q.shape[:2]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)
    elif B != 1:
        raise ValueError("cu_seqlens needs B == 1 (FLA's contract)")
    h0 = None if initial_state is None else initial_state.transpose(-1, -2).contiguous()
    o, ht = kda(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), g.flatten(0, 1).float(),
                beta.flatten(0, 1).float(), cu_seqlens.to(torch.int32), scale=scale,
                initial_state=h0, output_final_state=output_final_state,
                plan_name="kda_hopper_cuda")
    return o.unflatten(0, (B, T)), (ht.transpose(-1, -2) if output_final_state else None)


def results(fn, leaves, cu, do, backward, **options):
    """fn's output and, with backward, the gradients of the leaves, as the timed steps call it."""
    o, _ = fn(*leaves, cu_seqlens=cu, **options)
    out = {"o": o.detach()}
    if backward:
        o.backward(do)
        out.update({"d" + n: t.grad for n, t in zip(("q", "k", "v", "g", "beta"), leaves)})
        for t in leaves:
            t.grad = None
    return out


def check_cudnn(arms, leaves, cu, do, ops):
    """Before timing: the cudnn arm's forward, then its backward, then each op once as measure()
    calls it (the first calls compile its kernels); then its output and gradients against cake's
    and FLA's. What raises is refused, and with it every op it belongs to: the forward takes all
    ops, the backward all but "fwd" (not tried again: cuDNN caches a graph even when pinning it to
    the engine failed, and routes that graph to any engine at the next call). Returns
    ({op: why it is refused}, {reference arm: {tensor: relative RMS of cudnn's against it}, or
    why they were not compared})."""
    fn = arms["cudnn"][0]
    refused, mine = {}, None

    def refuse(op_list, e):
        for op in op_list:
            refused.setdefault(op, f"{type(e).__name__}: {' '.join(str(e).split())}")
        for t in leaves:  # a backward that raised may have left gradients behind
            t.grad = None

    for backward, belong in ((False, ops), (True, [op for op in ops if op != "fwd"])):
        if belong and not any(op in refused for op in belong):
            try:
                mine = results(fn, leaves, cu, do, backward)
            except Exception as e:  # noqa: BLE001 - whatever the engine refuses, the arm skips
                refuse(belong, e)
    for op in ops:
        if op not in refused:
            try:
                make_step(fn, op, leaves, cu, do)()
            except Exception as e:  # noqa: BLE001
                refuse([op], e)
    agreement = {}
    for ref in ("cake", "fla") if mine is not None else ():
        if ref in arms:  # one reference's results at a time: at P4_H64 each set is ~25 GB
            try:
                theirs = results(arms[ref][0], leaves, cu, do, backward="dq" in mine)
                agreement[ref] = {n: rel_rms(mine[n], theirs[n]) for n in mine}
                del theirs
            except torch.cuda.OutOfMemoryError:  # three result sets at once (H100 at P4_H64)
                agreement[ref] = "not compared: out of memory"
            except Exception as e:  # noqa: BLE001 - a failing baseline: its arm skips later
                agreement[ref] = f"not compared: {e!r}"
            for t in leaves:
                t.grad = None
            torch.cuda.empty_cache()
    return refused, agreement


def agreement_with_cake(arms, leaves, cu, do, backward, options):
    """bench_gdn.agreement_with_cake on results(); cudnn is left to its own check (check_cudnn).
    Where cake's own results do not fit with the leaves (P4_H64 on an H100), none is compared."""
    try:
        return bench_gdn.agreement_with_cake(
            arms, lambda fn: results(fn, leaves, cu, do, backward, **options), leaves,
            skip=("cudnn",))
    except torch.cuda.OutOfMemoryError:
        return {n: "not compared: out of memory" for n in arms if not n.startswith("cake")}


def make_inputs(docs, H, HV, seed=0, g_draw="uniform"):
    """g_draw "uniform": g uniform in (-5, 0) per channel (workloads.json), every channel's state
    decaying by ~e^-160 a chunk; "layer": the bounded gate of FLA's KDA layer at its
    initialisation, -5 sigmoid(a x) with a = exp(A_log) uniform in [1, 16] per value head and
    x ~ N(0, 1): about half the channels decay slowly (g near 0), so state crosses chunks, and a
    schedule that starts from zero state once the decay is small (cuDNN's engine) gains less."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(docs)
    kw = dict(device="cuda", generator=gen)
    q = F.normalize(torch.randn(1, T, H, K, **kw), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, H, K, **kw), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    if g_draw == "uniform":
        g = -5.0 * torch.rand(1, T, HV, K, **kw)
    else:
        a = 1.0 + 15.0 * torch.rand(HV, 1, **kw)
        g = -5.0 * torch.sigmoid(a * torch.randn(1, T, HV, K, **kw))
    beta = torch.rand(1, T, HV, **kw).bfloat16()
    cu = torch.tensor([0] + docs, device="cuda").cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, V, dtype=torch.bfloat16, **kw)
    return (q, k, v, g, beta), cu, do


def raw_gate(inputs, seed=0):
    """--gate in_op: the inputs with g as a layer's raw bf16 projection, ~N(0, 1), and the ops'
    keyword options that make the op compute the bounded gate -5 sigmoid(exp(A_log) (g +
    dt_bias)) itself (use_gate_in_kernel, lower_bound=-5), A_log and dt_bias with gradients as a
    layer's parameters."""
    q, k, v, g, beta = inputs
    HV = g.shape[2]
    kw = dict(device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed + 1))
    raw = torch.randn(g.shape, **kw).bfloat16()
    options = dict(use_gate_in_kernel=True, lower_bound=-5.0,
                   A_log=(3.0 * torch.rand(HV, **kw)).requires_grad_(),
                   dt_bias=(0.1 * torch.randn(HV * K, **kw)).requires_grad_())
    return (q, k, v, raw, beta), options


def shapes(workload, heads, spec):
    if workload == "P4":
        docs = spec["kda"]["single_gpu"]["P4"]["docs"]
        return [(f"P4_H{h}", docs, h, h) for h in heads]
    if workload == "A":
        docs = spec["gdn"]["single_gpu"]["A"]["docs"]
        return [("A_16x48", docs, 16, 48)]
    raise ValueError(workload)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="+", default=["P4", "A"])
    parser.add_argument("--heads", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--ops", nargs="+", default=["fwd", "fwd+bwd", "ckpt"],
                        choices=["fwd", "fwd+bwd", "ckpt"])
    parser.add_argument("--arms", nargs="+", default=None, help="subset of arms")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--gate", choices=["activated", "in_op"], default="activated",
                        help="g given activated (default), or raw with the op's in-op gate "
                             "(use_gate_in_kernel, as FLA's KDA layer calls it; no cudnn arm)")
    parser.add_argument("--g-draw", choices=["uniform", "layer"], default="uniform",
                        help="activated g uniform in (-5, 0) (workloads.json), or as FLA's KDA "
                             "layer's bounded gate at initialisation (make_inputs)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new cell after this many seconds (a device call's limit: "
                             "the cells done are written, the rest named as not run)")
    args = parser.parse_args()

    spec = json.loads((HERE / "workloads.json").read_text())
    arms = chosen_arms(load_arms(), args.arms)
    if args.gate == "in_op" and arms.pop("cudnn", None) is not None:
        print("cudnn arm left out: its engine takes no in-op gate", flush=True)
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                commit=os.environ.get("CAKE_COMMIT") or git_commit(), torch=torch.__version__,
                versions={n: a[1] for n, a in arms.items()}, op_name="chunk_kda",
                fla_backend_dispatch=os.environ["FLA_DISABLE_BACKEND_DISPATCH"] != "1",
                gate=args.gate, g_draw=args.g_draw)
    l2 = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    out = args.out.open("a") if args.out else None
    started = time.monotonic()

    def out_of_time(what: str) -> bool:
        if args.budget_s is None or time.monotonic() - started < args.budget_s:
            return False
        print(f"{what}: not run (--budget-s {args.budget_s:g} s spent)", flush=True)
        return True

    for wl in args.workloads:
        for name, docs, H, HV in shapes(wl, args.heads, spec):
            if out_of_time(name):
                continue
            inputs, cu, do = make_inputs(docs, H, HV, g_draw=args.g_draw)
            options = {}
            if args.gate == "in_op":
                inputs, options = raw_gate(inputs)
            leaves = [t.requires_grad_() for t in inputs]
            against_cake = agreement_with_cake(arms, leaves, cu, do,
                                               any(op != "fwd" for op in args.ops), options)
            for arm, errors in against_cake.items():
                print(f"{name:8s} {arm} vs cake: " + (errors if isinstance(errors, str) else
                      "  ".join(f"{n} {e:.2e}" for n, e in errors.items())), flush=True)
            refused, agreement = {}, {}
            if "cudnn" in arms:
                refused, agreement = check_cudnn(arms, leaves, cu, do, args.ops)
                for ref, errors in agreement.items():
                    if isinstance(errors, str):
                        print(f"{name:8s} cudnn vs {ref}: {errors}", flush=True)
                        continue
                    print(f"{name:8s} cudnn rel-RMS vs {ref}: "
                          + "  ".join(f"{n} {e:.2e}" for n, e in errors.items())
                          + ("" if max(errors.values()) <= 1e-2 else "   (above 1e-2)"),
                          flush=True)
                torch.cuda.empty_cache()
            for op in args.ops:
                if out_of_time(f"{name} {op}"):
                    continue
                if op in refused:
                    print(f"{name:8s} {op:8s} cudnn skipped: {refused[op]}", flush=True)
                    if out:
                        out.write(json.dumps(dict(meta, workload=name, op=op, arm="cudnn",
                                                  ms=None, skipped=refused[op])) + "\n")
                        out.flush()
                steps = {n: make_step(a[0], op, leaves, cu, do, **options)
                         for n, a in arms.items()
                         if not (n == "cudnn" and op in refused)}

                def skip(arm, error, name=name, op=op):
                    print(f"{name:8s} {op:8s} {arm} skipped: {error!r}", flush=True)
                    if out:
                        out.write(json.dumps(dict(meta, workload=name, op=op, arm=arm, ms=None,
                                                  skipped=repr(error))) + "\n")
                        out.flush()

                steps = steps_that_run(steps, leaves, skip)
                if "cake" not in steps or "cake_control" not in steps:
                    print(f"{name:8s} {op:8s} not timed: cake's arm does not fit", flush=True)
                    del steps
                    torch.cuda.empty_cache()
                    continue
                per_group = measure(steps, args.groups, args.iters, l2)
                peaks = {n: peak_bytes(s) for n, s in steps.items()}
                kernels = {n: kernel_times(steps[n]) for n in PROFILED_ARMS if n in steps}
                cake_ms = statistics.median(per_group["cake"])
                for arm, medians in per_group.items():
                    ms = statistics.median(medians)
                    line = dict(meta, workload=name, op=op, arm=arm, ms=ms,
                                speedup_vs_cake=None if arm.startswith("cake") else ms / cake_ms,
                                peak_extra_gib=peaks[arm] / 2**30, kernels_ms=kernels.get(arm),
                                drift=(medians[-1] - medians[0]) / medians[0], groups=medians)
                    if arm == "cudnn":
                        line["agreement"] = agreement
                    elif arm in against_cake:
                        line["agreement_with_cake"] = against_cake[arm]
                    if out:
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                    print(f"{name:8s} {op:8s} {arm:13s} {ms:9.3f} ms  "
                          f"{line['peak_extra_gib']:6.2f} GiB"
                          + ("" if line["speedup_vs_cake"] is None
                             else f"   cake is {line['speedup_vs_cake']:.2f}x faster"), flush=True)
                control = statistics.median(per_group["cake_control"]) / cake_ms
                print(f"{name:8s} {op:8s} control ratio {control:.3f} (accept 0.98-1.02)",
                      flush=True)
                for arm, times in kernels.items():
                    print(f"{name:8s} {op:8s} {arm} kernels: {kernel_summary(times)}", flush=True)
                del steps
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
