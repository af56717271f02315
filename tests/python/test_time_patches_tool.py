"""tools/time_patches.sh refuses a patch name that docs/next does not hold, before building or
timing anything (it would otherwise time main under that name)."""

import pathlib
import shutil
import subprocess

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "time_patches.sh"


def test_a_missing_patch_fails_before_any_build(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(TOOL, tmp_path / "tools")
    check = tmp_path / "build" / "device" / "cake_cuda_check"
    check.parent.mkdir(parents=True)
    check.write_text("#!/bin/sh\n")
    check.chmod(0o755)
    (tmp_path / "docs" / "next").mkdir(parents=True)
    (tmp_path / "docs" / "next" / "present.patch").write_text("")
    run = subprocess.run(["bash", "tools/time_patches.sh"], cwd=tmp_path, capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PATCHES": "present+absent"})
    assert run.returncode == 1
    assert "no docs/next/absent.patch" in run.stdout
