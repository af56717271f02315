"""bench/accuracy.py's gate on the CPU, with made-up outputs in place of the GPU runs: cake passes
an output where its errors are finite, its relative RMS error <= 1e-2, its max-abs error
<= 2e-2 x max|ref|, and its relative RMS error <= 1.1 x FLA's (where FLA ran the case; the
bounds alone where it failed)."""

import json
import sys
import types

import pytest
import torch

from conftest import import_bench

accuracy = import_bench("accuracy")

N = 400
REF = torch.ones(N, dtype=torch.float64)


def uniform(e):
    """An output off the reference by e everywhere: relative RMS and max-abs errors e."""
    return REF * (1 + e)


def spike(e):
    """An output off by e at one element: max-abs error e, relative RMS e / sqrt(N) = e / 20."""
    out = REF.clone()
    out[7] += e
    return out


# output name: (cake's output, FLA's output, whether cake passes the gate)
OUTPUTS = {
    "equal_errors": (uniform(5e-3), uniform(5e-3), True),
    "within_1.1x_fla": (uniform(5.4e-3), uniform(5e-3), True),
    "beyond_1.1x_fla": (uniform(5.6e-3), uniform(5e-3), False),
    "rms_within_1e-2": (uniform(9.5e-3), uniform(2e-2), True),
    "rms_beyond_1e-2": (uniform(1.05e-2), uniform(2e-2), False),
    "max_within_2e-2": (spike(1.9e-2), uniform(5e-3), True),
    "max_beyond_2e-2": (spike(2.1e-2), uniform(5e-3), False),
    "non_finite": (REF.clone().index_fill_(0, torch.tensor([3]), float("inf")),
                   uniform(5e-3), False),
}
# where FLA fails on the case: cake's errors against the bounds alone
FLA_FAILED = {
    "within_bounds": (uniform(9e-3), None, True),
    "rms_beyond_1e-2": (uniform(1.05e-2), None, False),
}


def case(outputs):
    """A case of accuracy.gdn_cases' form whose 'runs' return the outputs given."""
    def ours():
        return {name: o[0] for name, o in outputs.items()}

    def fla():
        if any(o[1] is None for o in outputs.values()):
            raise RuntimeError("FLA fails on this case")
        return {name: o[1] for name, o in outputs.items()}

    reference = lambda inputs, dout, dht: {name: REF for name in outputs}  # noqa: E731
    return ours, fla, lambda seed: (None, None, None), reference, False


@pytest.fixture
def gate_lines(monkeypatch, tmp_path, capsys):
    """Runs accuracy.main on the two made-up cases; returns {(case, output): JSON line}."""
    cases = {"fla_ran": case(OUTPUTS), "fla_failed": case(FLA_FAILED)}
    monkeypatch.setattr(accuracy, "gdn_cases", lambda: cases)
    monkeypatch.setattr(accuracy, "run", lambda fn, inputs, dout, dht, l2: fn())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "none")
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))
    monkeypatch.setitem(sys.modules, "flash_qla", None)  # not installed: not reported
    out = tmp_path / "accuracy.jsonl"
    monkeypatch.setattr(sys, "argv", ["accuracy.py", "--op", "gdn", "--out", str(out)])
    accuracy.main()
    printed = capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(OUTPUTS) + len(FLA_FAILED) == len(printed.splitlines()) - 1
    return {(line["case"], line["output"]): line for line in lines}


def test_the_gate_of_each_output(gate_lines):
    for case_name, outputs in (("fla_ran", OUTPUTS), ("fla_failed", FLA_FAILED)):
        for name, (_, _, passes) in outputs.items():
            assert gate_lines[case_name, name]["gate"] is passes, (case_name, name)


def test_the_errors_reported(gate_lines):
    line = gate_lines["fla_ran", "max_beyond_2e-2"]
    assert line["cake"]["max_abs_rel"] == pytest.approx(2.1e-2)
    assert line["cake"]["rel_rms"] == pytest.approx(2.1e-2 / 20)
    assert line["fla"]["rel_rms"] == pytest.approx(5e-3) and line["cake"]["finite"]
    assert not gate_lines["fla_ran", "non_finite"]["cake"]["finite"]
    assert gate_lines["fla_failed", "within_bounds"]["fla"] is None
