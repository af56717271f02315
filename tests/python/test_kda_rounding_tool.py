"""tools/kda_bwd_rounding.py, small: its exact model equals cake's FP64 reference, its fp32 scheme
sits at fp32's level and its bf16 schemes above it (so a rounding switch that does nothing fails)."""

import importlib.util
import pathlib

import torch

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "kda_bwd_rounding.py"
spec = importlib.util.spec_from_file_location("kda_bwd_rounding", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

NAMES = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
DOCS = [1, 63, 65]


def worst(scheme, inp, ref):
    out = tool.model(scheme, inp)
    return max(tool.errors(out[n], ref[n])[0] for n in NAMES)


def test_exact_model_is_cakes_reference():
    for case in ("bounded", "mixed"):
        inp = tool.make_inputs(case, 3, 1, 16, 16, DOCS)
        ex, ck = tool.model(tool.EXACT, inp), tool.cake_reference(inp)
        assert max(tool.errors(ex[n], ck[n])[0] for n in NAMES) < 1e-10


def test_roundings_take_effect():
    torch.manual_seed(0)
    inp = tool.make_inputs("bounded", 4, 1, 16, 16, DOCS)
    ref = tool.model(tool.EXACT, inp)
    by_name = {s.name: s for s in tool.SCHEMES}
    assert worst(tool.FP32, inp, ref) < 1e-4
    for name in ("a", "d"):
        assert 1e-4 < worst(by_name[name], inp, ref) < 5e-2
