"""The multi-GPU launcher on the CPU: tools/kcp_multi_gpu.sh starts tests/multi_gpu/kcp_check.py
through torchrun as 2 gloo processes (float64 against the FP64 reference), the same script and
launcher that run over NCCL on several GPUs. Every configuration must be reported ok and the
launcher must exit 0. Skipped where torch.distributed or torchrun is missing."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch.distributed as dist

import cake.kcp as kcp

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not dist.is_available() or shutil.which("bash") is None
                    or importlib.util.find_spec("torch.distributed.run") is None,
                    reason="needs torch.distributed, torchrun (torch.distributed.run) and bash")
def test_launcher_runs_the_check_on_two_cpu_processes():
    env = dict(os.environ, KCP_PYTHON=sys.executable, KCP_TIMEOUT="150")
    run = subprocess.run(
        ["bash", str(ROOT / "tools" / "kcp_multi_gpu.sh"), "2", "--backend", "gloo",
         "--device", "cpu", "--timeout", "120"],
        capture_output=True, text=True, timeout=200, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for variant in ("gdn", "kda"):
        for layout in kcp.LAYOUTS:
            for P in (1, 2):
                assert f"W=2 {variant} {layout} P={P}: ok" in out, out[-4000:]
    assert "W=2 mismatched context and call: ok" in out, out[-4000:]
    assert "kcp_check W=2: passed (13 checks, 0 problems)" in out, out[-4000:]
