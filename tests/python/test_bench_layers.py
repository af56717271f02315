"""bench/bench_layers.py's agreement check on the CPU: each baseline layer's output and gradients
against cake's layer (on its FP64 reference), so that a baseline computing something else, or
failing, is seen."""

import pytest
import torch
from torch import nn

import cake

from conftest import import_bench

bench_layers = import_bench("bench_layers")


class Scaled(nn.Module):
    """A layer whose output is another layer's times a factor: its parameters' names differ, so
    only o and dx compare."""

    def __init__(self, layer, factor):
        super().__init__()
        self.inner, self.factor = layer, factor

    def forward(self, x, **kwargs):
        o, _, cache = self.inner(x, **kwargs)
        return self.factor * o, None, cache


class Failing(nn.Module):
    def forward(self, x, **kwargs):
        raise RuntimeError("refused")


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_each_baseline_layer_is_compared_with_cake(kind):
    torch.manual_seed(0)
    cls = cake.layers.GatedDeltaNet if kind == "gdn" else cake.layers.KimiDeltaAttention
    layer = cls(hidden_size=16, expand_v=1, head_dim=8, num_heads=2, num_v_heads=4).double()
    docs = [5, 1, 9]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, sum(docs), 16, generator=gen, dtype=torch.float64).requires_grad_()
    do = torch.randn(1, sum(docs), 16, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0] + docs).cumsum(0).to(torch.int32)
    arms = {"cake": (layer, "0", {}), "cake_segments": (layer, "0", {"cu_seqlens_cpu": True}),
            "twin": (layer, "0", {}), "off": (Scaled(layer, 1.01), "0", {}),
            "broken": (Failing(), "0", {}), "cake_control": (layer, "0", {})}
    got = bench_layers.agreement(arms, x, cu, do)
    assert set(got) == {"cake_segments", "twin", "off", "broken"}
    assert all(e == 0.0 for e in got["cake_segments"].values())  # the CPU runs no segments
    assert set(got["twin"]) == {"o", "dx"} | {f"d{n}" for n, _ in layer.named_parameters()}
    assert all(e == 0.0 for e in got["twin"].values())
    assert set(got["off"]) == {"o", "dx"}
    assert got["off"]["o"] == pytest.approx(0.01, rel=1e-6)
    assert got["off"]["dx"] == pytest.approx(0.01, rel=1e-6)
    assert got["broken"] == "not compared: RuntimeError: refused"
    assert x.grad is None and all(p.grad is None for p in layer.parameters())
    assert "worst parameter gradient" in bench_layers.describe(got["twin"])
