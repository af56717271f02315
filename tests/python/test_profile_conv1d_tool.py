"""tools/profile_conv1d.py (the conv1d_profile stage of tools/device_check.sh): its help names
what it profiles, and without a GPU it stops with a clear message instead of a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "profile_conv1d.py"


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=120)


def test_help_says_what_it_profiles():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert "--pack" in result.stdout and "--dim" in result.stdout and "--arms" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_clearly():
    result = run("--pack", "M")
    assert result.returncode == 2
    assert "needs a CUDA device" in result.stderr
    assert "Traceback" not in result.stderr
