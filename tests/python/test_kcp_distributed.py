"""cake.kcp over real torch.distributed processes (gloo on the CPU, torch.multiprocessing spawn):
for W = 2 and 4, GDN and KDA on a small random pack, the outputs, final states and every gradient
equal the single-rank op's (compared in the parent); mismatched contexts and calls raise ValueError
on every process, and a process that does not finish in time fails the test instead of hanging."""

import datetime
import os
import pathlib
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cake.kcp as kcp
from conftest import assert_rel, call_cake, cotangents, gradients, leaf_names, leaves, make_case
from test_kcp import mild

TOL = 1e-9
PER_TOKEN = ("q", "k", "v", "g", "beta")
PER_BATCH = ("initial_state", "A_log", "dt_bias")
PROCESS_TIMEOUT = 60.0  # seconds for all processes of one spawn
# Lengths 70, 3, 181, 1, 45 (a document spans every rank at W = 4) and an empty one.
CU = [0, 70, 73, 254, 255, 255, 300]
# (name, variant, layout, P, make_case keywords) per world size: one layout each. "gdn_odd":
# float32 with HV K (K + V) odd, so that a rank's message is not a multiple of 8 bytes and the
# next rank's starts at an odd offset of gloo's buffer.
RUNS = {2: [("gdn", "gdn", "zigzag", 2, {}), ("kda", "kda", "contiguous", 1, {}),
            ("gdn_odd", "gdn", "contiguous", 1, dict(HV=1, K=3, V=2, dtype=torch.float32))],
        4: [("gdn", "gdn", "zigzag_per_document", 1, {}), ("kda", "kda", "zigzag", 3, {})]}
TOL_FLOAT32 = 2e-5  # float32 records and states (test_kcp.py's float32 test)


def _init(rank, world_size, tmp):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=30))


def _finish(result, path):
    """Saves this rank's result, waits for every rank at a barrier, and leaves without the
    interpreter's teardown: gloo's threads at exit sometimes abort a finished process
    ("terminate called without an active exception", about 1 run in 9), which would fail the test
    after every result was already computed and saved."""
    torch.save(result, path)
    if dist.is_initialized():
        dist.barrier()
    os._exit(0)


def _exactness_worker(rank, world_size, tmp):
    tmp = pathlib.Path(tmp)
    out = {}
    try:
        _init(rank, world_size, tmp)
        for name, case in torch.load(tmp / "cases.pt").items():
            t, opts, do, dht = case["t"], case["opts"], case["do"], case["dht"]
            ctx = kcp.build_context(t["cu_seqlens"], group=dist.group.WORLD,
                                    layout=case["layout"], segments=case["P"])
            local = {n: kcp.shard(t[n], ctx).requires_grad_() for n in PER_TOKEN}
            shared = {n: t[n].clone().requires_grad_() for n in PER_BATCH if n in t}
            fn = kcp.chunk_kda_kcp if case["kda"] else kcp.chunk_gated_delta_rule_kcp
            o, ht = fn(*(local[n] for n in PER_TOKEN), ctx, **opts, **shared)
            ((o * kcp.shard(do, ctx)).sum() + (ht * dht).sum()).backward()
            out[name] = {"o": kcp.unshard(o.detach(), ctx), "final_state": ht.detach(),
                         **{f"d{n}": kcp.unshard(x.grad, ctx) for n, x in local.items()},
                         **{f"d{n}": x.grad for n, x in shared.items()}}
    except Exception:  # noqa: BLE001 - reported to the parent
        out = {"error": traceback.format_exc()}
    _finish(out, tmp / f"rank{rank}.pt")


def _mismatch_worker(rank, world_size, tmp):
    tmp = pathlib.Path(tmp)
    outcomes = {}
    try:
        _init(rank, world_size, tmp)
        layout = "zigzag" if rank == 1 else "contiguous"
        try:
            kcp.build_context(CU, group=dist.group.WORLD, layout=layout)
            outcomes["context"] = "no error"
        except ValueError as e:
            outcomes["context"] = f"ValueError: {e}"
        ctx = kcp.build_context(CU, group=dist.group.WORLD, layout="zigzag")
        t, _ = make_case(0, kda=False, cu=CU, HV=2, V=16 if rank == 1 else 8)
        local = [kcp.shard(t[n].detach(), ctx) for n in PER_TOKEN]
        try:
            kcp.chunk_gated_delta_rule_kcp(*local, ctx)
            outcomes["call"] = "no error"
        except ValueError as e:
            outcomes["call"] = f"ValueError: {e}"
    except Exception:  # noqa: BLE001 - reported to the parent
        outcomes["error"] = traceback.format_exc()
    _finish(outcomes, tmp / f"rank{rank}.pt")


def _spawn(worker, world_size, tmp):
    """Runs worker(rank, world_size, tmp) in world_size processes; fails the test (after killing
    them) when they are not all done within PROCESS_TIMEOUT. Returns every rank's saved dict."""
    context = mp.start_processes(worker, args=(world_size, str(tmp)), nprocs=world_size,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{worker.__name__}: processes still running after {PROCESS_TIMEOUT} s")
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world_size)]


@pytest.mark.parametrize("world_size", sorted(RUNS))
def test_gloo_kcp_equals_single_rank(world_size, tmp_path):
    cases, expected = {}, {}
    for seed, (name, variant, layout, P, extra) in enumerate(RUNS[world_size]):
        kda = variant == "kda"
        t, opts = mild(*make_case(seed, kda=kda, cu=CU, **{"HV": 2, **extra},
                                  initial_state=True, l2norm=kda, gate=not kda, dt_bias=not kda))
        o, ht = call_cake(kda, t, opts)
        do, dht = cotangents(o.detach(), ht.detach(), seed)
        grads = gradients(o, ht, do, dht, leaves(t))
        expected[name] = {"o": o.detach(), "final_state": ht.detach(),
                          **{f"d{n}": g for n, g in zip(leaf_names(t), grads)}}
        cases[name] = {"t": {n: x.detach() for n, x in t.items()}, "opts": opts, "do": do,
                       "dht": dht, "kda": kda, "layout": layout, "P": P}
    torch.save(cases, tmp_path / "cases.pt")
    ranks = _spawn(_exactness_worker, world_size, tmp_path)
    for r, out in enumerate(ranks):
        assert "error" not in out, f"rank {r} failed:\n{out.get('error')}"
    for case, want in expected.items():
        tol = TOL_FLOAT32 if want["o"].dtype == torch.float32 else TOL
        for name, value in want.items():
            if name in ("final_state", "dinitial_state", "dA_log", "ddt_bias"):
                got = sum(out[case][name] for out in ranks)  # partial per rank
            else:
                got = ranks[0][case][name]
                for out in ranks[1:]:
                    assert torch.equal(out[case][name], got), f"{case} {name}: unshard"
            assert_rel(got, value, tol, f"{case} W={world_size} {name}")


def test_gloo_mismatch_raises_on_every_process(tmp_path):
    ranks = _spawn(_mismatch_worker, 2, tmp_path)
    for r, out in enumerate(ranks):
        assert "error" not in out, f"rank {r} failed:\n{out.get('error')}"
        assert out["context"].startswith("ValueError: build_context: the ranks disagree on "
                                         "layout"), out["context"]
        assert out["call"].startswith("ValueError: chunk_gated_delta_rule_kcp: the ranks "
                                      "disagree on head_dim_v"), out["call"]
