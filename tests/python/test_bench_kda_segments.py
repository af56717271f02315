"""bench/bench_kda.py's cake_kcp_p4 arm on the CPU: cake.kcp on one rank with P segments forced
gives cake.chunk_kda's output and gradients (the FP64 reference either way), called as the
benchmark calls its arms."""

import pytest
import torch
import torch.nn.functional as F

import cake

from conftest import import_bench

bench_kda = import_bench("bench_kda")


@pytest.mark.parametrize("P", [0, 1, 4])
def test_kcp_segments_arm_matches_the_op(P):
    gen = torch.Generator().manual_seed(3)
    docs, H, HV, K = [70, 1, 200], 1, 2, 8
    T = sum(docs)
    q = F.normalize(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, HV, K, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, T, HV, K, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, T, HV, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    do = torch.randn(1, T, HV, K, generator=gen, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    arm = bench_kda.kcp_segments(P)
    got = bench_kda.results(arm, leaves, cu, do, True)
    again = bench_kda.results(arm, leaves, cu, do, True)  # the kept context, a second call
    want = bench_kda.results(cake.chunk_kda, leaves, cu, do, True)
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, rtol=1e-9, atol=1e-10, msg=name)
        assert torch.equal(again[name], got[name]), name
