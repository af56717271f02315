"""tools/kda_bwd_rounding.py, small: its exact model equals cake's FP64 reference, its folded walks
in float64 equal the exact model, its fp32 scheme sits at fp32's level and its bf16 schemes above
it (so a rounding switch that does nothing fails)."""

import argparse
import importlib.util
import pathlib

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "kda_bwd_rounding.py"
spec = importlib.util.spec_from_file_location("kda_bwd_rounding", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

DOCS = [1, 63, 65]


def worst(scheme, inp, ref):
    out = tool.model(scheme, inp)
    return max(tool.errors(out[n], ref[n])[0] for n in tool.NAMES)


def test_exact_model_is_cakes_reference():
    # the tool's own check: the exact model against cake's FP64 reference, and its anchored and
    # frame paths in float64 against the exact model, on every case
    assert tool.check(argparse.Namespace(k=16, heads=1), DOCS) < 1e-10


def test_roundings_take_effect():
    inp = tool.make_inputs("bounded", 4, 1, 16, 16, DOCS)
    ref = tool.model(tool.EXACT, inp)
    by_name = {s.name: s for s in tool.SCHEMES}
    assert worst(tool.FP32, inp, ref) < 1e-4
    for name in ("a", "d"):
        assert 1e-4 < worst(by_name[name], inp, ref) < 5e-2


def test_folded_walks_are_the_chain():
    # Delta = U - W h and dS <- gamma dS + X - W^T dv2 associate the chain's products the other
    # way: in float64 without rounding they give the exact model's numbers; with bf16 operands
    # they round elsewhere than the chain (so the folded path is the one that ran) and stay near.
    # "mixed" has channels with g = 0, so the states carry across chunks at K = 16.
    inp = tool.make_inputs("mixed", 5, 1, 16, 16, DOCS)
    ref = tool.model(tool.EXACT, inp)
    assert worst(tool.FOLDED64, inp, ref) < 1e-13
    by_name = {s.name: s for s in tool.SCHEMES + tool.VARIANTS}
    assert 1e-4 < worst(by_name["d/folded"], inp, ref) < 5e-2
    chain, folded = tool.model(by_name["d"], inp), tool.model(by_name["d/folded"], inp)
    assert all((folded[n] != chain[n]).any() for n in tool.NAMES)
