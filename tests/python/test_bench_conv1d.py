"""bench/bench_conv1d.py's agreement check on the CPU: each baseline's y and dx against cake's
(cake's arm on its FP64 reference), so that a baseline computing something else is seen."""

import pytest
import torch

import cake

from conftest import import_bench

bench_conv1d = import_bench("bench_conv1d")


def test_each_baseline_is_compared_with_cake():
    def cake_fn(x, w, b, cu, seq_idx):  # the bench's cake arm (load_arms imports the others)
        return cake.causal_conv1d(x, w, b, activation=bench_conv1d.ACTIVATION, cu_seqlens=cu)[0]

    gen = torch.Generator().manual_seed(5)
    docs, dim, width = [5, 1, 9], 6, 4
    T = sum(docs)
    leaves = [torch.randn(1, T, dim, generator=gen).double(),
              torch.randn(dim, width, generator=gen).double(),
              torch.randn(dim, generator=gen).double()]
    leaves = [t.requires_grad_() for t in leaves]
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    dy = torch.randn(1, T, dim, generator=gen).double()

    def failing(*args):
        raise RuntimeError("refused")

    arms = {"cake": (cake_fn, "0"), "twin": (cake_fn, "0"),
            "off": (lambda *a: 1.01 * cake_fn(*a), "0"), "broken": (failing, "0"),
            "cake_control": (cake_fn, "0")}
    got = bench_conv1d.agreement_with_cake(arms, leaves, cu, None, dy)
    assert set(got) == {"twin", "off", "broken"}
    assert got["twin"] == {"y": 0.0, "dx": 0.0}
    # compared in fp32
    assert got["off"]["y"] == pytest.approx(0.01, rel=1e-4)
    assert got["off"]["dx"] == pytest.approx(0.01, rel=1e-4)
    assert got["broken"] == "not compared: RuntimeError: refused"
    assert all(t.grad is None for t in leaves)
