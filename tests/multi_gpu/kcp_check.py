"""cake.kcp across processes, one per GPU: the context-parallel GDN and KDA over torch.distributed
(NCCL between GPUs; gloo between CPU processes, so that the same script runs without a GPU),
started by torchrun (tools/kcp_multi_gpu.sh starts it for W = 2, 4, 8 as the GPUs allow).

Every rank builds the same global pack (one seed), runs the KCP op on its shard with an initial
state and the final state, and the backward of its part of the loss; outputs, final states and
every gradient are then gathered on every rank. Rank 0 also runs the single-rank op on the whole
pack and compares:
  CUDA: bf16 q, k, v, fp32 g, beta and states, K = V = 128, the q/k L2 norm in the kernel, within
        the accuracy gate of bench/workloads.json (rel-RMS <= 1e-2, max-abs <= 2e-2 x max|ref|,
        all finite);
  CPU:  float64, K = V = 8, against the FP64 reference to 1e-9 (both measures).
For GDN and KDA, every layout, P = 1 and 2 segments per fragment. Each configuration runs twice
and each rank's two results must be equal bitwise. On CUDA, each variant's forward and backward,
NCCL all-gathers included, captured in a CUDA graph must replay the eager results bitwise. Then a
context that differs on the last rank (its layout) and a later call that differs there (its
scale) must raise ValueError on every rank (the call's at cake.kcp.check_calls on CUDA tensors).

A watchdog (--timeout) ends a process that is still running, printing its stack, so that a hang
fails the run; the exit status is 1 on any failure, on every rank.

    torchrun --standalone --nproc_per_node 4 tests/multi_gpu/kcp_check.py
    torchrun --standalone --nproc_per_node 2 tests/multi_gpu/kcp_check.py --backend gloo --device cpu
"""

import argparse
import datetime
import faulthandler
import os
import sys

# NVLink multicast stays off (NCCL, PyTorch's symmetric memory, NVSHMEM): on the shared multi-GPU
# machines a program that uses it can put the host's GPUs out of service. Set before any
# communicator exists, whatever the caller's environment says.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cake  # noqa: E402
import cake.kcp as kcp  # noqa: E402

PER_TOKEN = ("q", "k", "v", "g", "beta")
SEGMENTS = (1, 2)
# Global cu_seqlens per device type. Documents shorter than a chunk (64 tokens), on chunk edges, and
# a long last one that spans 3+ ranks from W = 4 (CUDA) or W = 2 (CPU, where it also has an empty
# document and a size the FP64 reference walks in milliseconds).
PACKS = {"cuda": [0, 5, 17, 64, 65, 900, 963, 3000],
         "cpu": [0, 5, 17, 64, 65, 65, 180, 300]}
# (H, HV, K = V): grouped value heads on both.
DIMS = {"cuda": (2, 4, 128), "cpu": (1, 2, 8)}
# (rel-RMS limit, max-abs limit as a fraction of max|ref|).
GATES = {"cuda": (1e-2, 2e-2), "cpu": (1e-9, 1e-9)}
OPTIONS = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
# Results that each rank holds a part of (summed over ranks); the others are per token (unshard).
PARTIAL = ("final_state", "dinitial_state")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--variants", nargs="+", choices=("gdn", "kda"), default=["gdn", "kda"])
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for the whole run; past it each process prints its stack "
                             "and exits with status 1")
    args = parser.parse_args()
    if args.backend == "nccl" and args.device == "cpu":
        parser.error("NCCL exchanges CUDA tensors: use --backend gloo with --device cpu")
    return args


def init(args) -> torch.device:
    """Joins torchrun's process group; a rank's GPU is its LOCAL_RANK."""
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    return device


def make_batch(device: torch.device, kda: bool, seed: int) -> dict:
    """The global pack's inputs and cotangents, drawn on the CPU from one seed so that every rank
    holds the same ones. g decays slowly (log-sigmoid of N(3, 1): about e^-0.05 per token), so the
    state carried from one rank to the next changes the results far above the gate."""
    cu = PACKS[device.type]
    H, HV, K = DIMS[device.type]
    T, N = cu[-1], len(cu) - 1
    low = torch.bfloat16 if device.type == "cuda" else torch.float64    # q, k, v, o
    high = torch.float32 if device.type == "cuda" else torch.float64    # g, beta, states
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    g = F.logsigmoid(randn(*((1, T, HV, K) if kda else (1, T, HV)), dtype=torch.float64) + 3)
    return dict(
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        q=randn(1, T, H, K, dtype=low), k=randn(1, T, H, K, dtype=low),
        v=randn(1, T, HV, K, dtype=low), g=g.to(high),
        beta=(0.2 * torch.rand(1, T, HV, generator=gen, dtype=torch.float64)).to(high).to(device),
        initial_state=randn(N, HV, K, K, dtype=high),
        do=randn(1, T, HV, K, dtype=low), dht=randn(N, HV, K, K, dtype=high))


def single_rank(kda: bool, batch: dict) -> dict:
    """The single-rank op on the whole pack: outputs, final state and every gradient."""
    leaves = {n: batch[n].clone().requires_grad_() for n in PER_TOKEN + ("initial_state",)}
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    o, ht = fn(*(leaves[n] for n in PER_TOKEN), initial_state=leaves["initial_state"],
               cu_seqlens=batch["cu_seqlens"], **OPTIONS)
    torch.autograd.backward([o, ht], [batch["do"], batch["dht"]])
    return {"o": o.detach(), "final_state": ht.detach(),
            **{f"d{n}": x.grad for n, x in leaves.items()}}


def kcp_rank(kda: bool, batch: dict, layout: str, P: int):
    """This rank's KCP call on its shard and its backward: (context, this rank's results)."""
    ctx = kcp.build_context(batch["cu_seqlens"], group=dist.group.WORLD, layout=layout, segments=P)
    local = {n: kcp.shard(batch[n], ctx).requires_grad_() for n in PER_TOKEN}
    h0 = batch["initial_state"].clone().requires_grad_()
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp
    o, ht = fn(*(local[n] for n in PER_TOKEN), ctx, initial_state=h0, **OPTIONS)
    # Every rank passes the whole dht: the op takes the rows of the documents it ends.
    torch.autograd.backward([o, ht], [kcp.shard(batch["do"], ctx), batch["dht"]])
    return ctx, {"o": o.detach(), "final_state": ht.detach(),
                 **{f"d{n}": x.grad for n, x in local.items()}, "dinitial_state": h0.grad}


def gather(ctx, mine: dict) -> dict:
    """Every rank's results put together as the single-rank op's: per-token tensors unsharded, the
    partial ones summed over ranks in rank order (the same sum on every rank)."""
    return {n: sum(ctx.exchange.all_gather(x)) if n in PARTIAL else kcp.unshard(x, ctx)
            for n, x in mine.items()}


def gate_errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(rel-RMS error, max-abs error / max|want|); infinite when got is not finite or has another
    shape."""
    if got.shape != want.shape or not torch.isfinite(got).all():
        return float("inf"), float("inf")
    got, want = got.double().cpu(), want.double().cpu()
    err = got - want
    rel_rms = (err.norm() / want.norm().clamp_min(1e-30)).item()
    max_abs = (err.abs().max() / want.abs().max().clamp_min(1e-30)).item()
    return rel_rms, max_abs


def accuracy_problems(got: dict, want: dict, gate: tuple[float, float]) -> tuple[list, str]:
    """(what is outside the gate, the worst errors as text)."""
    errors = {name: gate_errors(got[name], reference) for name, reference in want.items()}
    problems = [f"{name}: rel-RMS {rel_rms:.2e}, max-abs {max_abs:.2e} x max|ref| (gate "
                f"{gate[0]:.0e}, {gate[1]:.0e})" for name, (rel_rms, max_abs) in errors.items()
                if rel_rms > gate[0] or max_abs > gate[1]]
    by_rms = max(errors, key=lambda n: errors[n][0])
    by_abs = max(errors, key=lambda n: errors[n][1])
    return problems, (f"worst rel-RMS {errors[by_rms][0]:.1e} ({by_rms}), max-abs "
                      f"{errors[by_abs][1]:.1e} ({by_abs})")


def verdict(label: str, problems: list, note: str, device: torch.device) -> int:
    """Prints this rank's problems and, on rank 0, the configuration's verdict over every rank;
    returns the number of problems over all ranks."""
    rank = dist.get_rank()
    for p in problems:
        print(f"rank {rank}: {label}: {p}", flush=True)
    total = torch.tensor([len(problems)], device=device)
    dist.all_reduce(total)
    total = int(total.item())
    if rank == 0:
        print(f"{label}: {'ok' if total == 0 else f'FAILED ({total} problems)'}"
              f"{'; ' + note if note else ''}", flush=True)
    return total


def expect_value_error(call, message: str) -> list:
    """[] when call() raises ValueError starting with message, else what happened instead."""
    try:
        call()
    except ValueError as e:
        return [] if str(e).startswith(message) else [f"ValueError of another kind: {e}"]
    return [f"no error (expected ValueError: {message} ...)"]


def check_mismatches(device: torch.device) -> list:
    """The last rank builds its context with another layout, then calls the op with another scale:
    every rank must raise ValueError naming the difference (the header all-gather), none may wait
    for the others. A hang is caught by the watchdog."""
    batch = make_batch(device, kda=False, seed=2)
    last = dist.get_world_size() - 1
    mine = dist.get_rank() == last
    problems = expect_value_error(
        lambda: kcp.build_context(batch["cu_seqlens"], group=dist.group.WORLD,
                                  layout="zigzag" if mine else "contiguous"),
        "build_context: the ranks disagree on layout")
    ctx = kcp.build_context(batch["cu_seqlens"], group=dist.group.WORLD, layout="contiguous")
    local = [kcp.shard(batch[n], ctx) for n in PER_TOKEN]
    kcp.chunk_gated_delta_rule_kcp(*local, ctx, use_qk_l2norm_in_kernel=True)  # agrees the sizes

    def differing_call():
        # A later call of agreed sizes: checked on the device, read at check_calls on CUDA
        # tensors (at once on CPU tensors).
        kcp.chunk_gated_delta_rule_kcp(*local, ctx, scale=0.5 if mine else None,
                                       use_qk_l2norm_in_kernel=True)
        kcp.check_calls(ctx)

    problems += expect_value_error(differing_call,
                                   "chunk_gated_delta_rule_kcp: the ranks disagree on scale")
    return problems


def graph_problems(kda: bool, batch: dict, layout: str, P: int) -> list:
    """This rank's KCP forward and backward (the NCCL all-gathers included) captured in a CUDA
    graph after two eager calls, then replayed: the replay must give the eager results bitwise."""
    ctx = kcp.build_context(batch["cu_seqlens"], group=dist.group.WORLD, layout=layout, segments=P)
    leaves = {n: kcp.shard(batch[n], ctx).requires_grad_() for n in PER_TOKEN}
    leaves["initial_state"] = batch["initial_state"].clone().requires_grad_()
    do = kcp.shard(batch["do"], ctx)
    fn = kcp.chunk_kda_kcp if kda else kcp.chunk_gated_delta_rule_kcp

    def step():
        for x in leaves.values():
            x.grad = None
        o, ht = fn(*(leaves[n] for n in PER_TOKEN), ctx, initial_state=leaves["initial_state"],
                   **OPTIONS)
        torch.autograd.backward([o, ht], [do, batch["dht"]])
        return {"o": o.detach().clone(), "final_state": ht.detach().clone(),
                **{f"d{n}": x.grad.clone() for n, x in leaves.items()}}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    kcp.check_calls(ctx)
    return [f"{n}: the graph's replay differs from the eager call" for n in eager
            if not torch.equal(eager[n], captured[n])]


def main() -> int:
    args = parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    device = init(args)
    W, rank = dist.get_world_size(), dist.get_rank()
    gate = GATES[device.type]
    if rank == 0:
        print(f"kcp_check: W = {W}, {args.backend}, {device.type}"
              f"{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}, "
              f"pack {PACKS[device.type]}, (H, HV, K) = {DIMS[device.type]}", flush=True)
    failures = checks = 0
    for seed, variant in enumerate(args.variants):
        kda = variant == "kda"
        batch = make_batch(device, kda, seed)
        want = single_rank(kda, batch) if rank == 0 else None
        for layout in kcp.LAYOUTS:
            for P in SEGMENTS:
                ctx, first = kcp_rank(kda, batch, layout, P)
                _, again = kcp_rank(kda, batch, layout, P)
                problems = [f"{n} differs between two runs" for n in first
                            if not torch.equal(first[n], again[n])]
                got = gather(ctx, first)
                note = ""
                if rank == 0:
                    accuracy, note = accuracy_problems(got, want, gate)
                    problems += accuracy
                failures += verdict(f"W={W} {variant} {layout} P={P}", problems, note, device)
                checks += 1
    if device.type == "cuda":
        for variant in args.variants:
            kda = variant == "kda"
            failures += verdict(f"W={W} {variant} CUDA graph", graph_problems(
                kda, make_batch(device, kda, 3), "zigzag_per_document", 2), "replay == eager",
                device)
            checks += 1
    if W > 1:
        failures += verdict(f"W={W} mismatched context and call",
                            check_mismatches(device), "ValueError on every rank", device)
        checks += 1
    elif rank == 0:
        print(f"W={W} mismatched context and call: skipped (one rank)", flush=True)
    if rank == 0:
        print(f"kcp_check W={W}: {'passed' if failures == 0 else 'FAILED'} "
              f"({checks} checks, {failures} problems)", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    # Leave without the interpreter's teardown: gloo's threads at exit sometimes abort a process
    # that has finished (tests/python/test_kcp_distributed.py), which torchrun reports as a failure.
    os._exit(status)
