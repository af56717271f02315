"""cake.kcp.causal_conv1d_kcp over real torch.distributed processes (gloo on the CPU): y and every
gradient equal the single-rank op's (compared in the parent), with halos that cross ranks."""

import pathlib
import traceback

import torch
import torch.distributed as dist

import cake.kcp as kcp
from test_kcp_conv1d import assert_close, make, single_rank
from test_kcp_distributed import _finish, _init, _spawn

# Documents of 2, 1, 40, 3 and 25 tokens: at 3 ranks and width 4, short pieces pass halos on.
CU = [0, 2, 3, 43, 46, 71]
WIDTH = 4


def _worker(rank, world_size, tmp):
    tmp = pathlib.Path(tmp)
    try:
        _init(rank, world_size, tmp)
        case = torch.load(tmp / "case.pt")
        t, dy = case["t"], case["dy"]
        ctx = kcp.build_context(CU, group=dist.group.WORLD, layout="zigzag_per_document")
        x = kcp.shard(t["x"], ctx).requires_grad_()
        w = t["weight"].clone().requires_grad_()
        b = t["bias"].clone().requires_grad_()
        r = kcp.shard(t["residual"], ctx).requires_grad_()
        y, _ = kcp.causal_conv1d_kcp(x, w, b, r, "silu", ctx=ctx)
        (y * kcp.shard(dy, ctx)).sum().backward()
        out = {"y": kcp.unshard(y.detach(), ctx), "x": kcp.unshard(x.grad, ctx), "weight": w.grad,
               "bias": b.grad, "residual": kcp.unshard(r.grad, ctx)}
    except Exception:  # noqa: BLE001 - reported to the parent
        out = {"error": traceback.format_exc()}
    _finish(out, tmp / f"rank{rank}.pt")


def test_gloo_conv_kcp_equals_single_rank(tmp_path):
    t = make(5, CU, WIDTH, extras=True)
    dy = torch.randn(1, CU[-1], 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    y_ref, g_ref = single_rank(t, CU, "silu", dy)
    torch.save({"t": t, "dy": dy}, tmp_path / "case.pt")
    ranks = _spawn(_worker, 3, tmp_path)
    for r, out in enumerate(ranks):
        assert "error" not in out, f"rank {r} failed:\n{out.get('error')}"
        assert_close(out["y"], y_ref, f"rank {r} y")
        assert_close(out["x"], g_ref["x"], f"rank {r} dx")
        assert_close(out["residual"], g_ref["residual"], f"rank {r} dresidual")
    for name in ("weight", "bias"):
        assert_close(sum(out[name] for out in ranks), g_ref[name], f"d{name}")
