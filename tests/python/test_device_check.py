"""tools/device_check.sh (the script every GPU call runs): a stage name it does not know stops it
before the build, with exit status 2, instead of a call that builds and runs nothing."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_stage_stops_before_the_build(tmp_path):
    env = dict(os.environ, CAKE_STAGES="tests kda-bench", OUT=str(tmp_path))
    result = subprocess.run(["bash", str(ROOT / "tools" / "device_check.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown stage 'kda-bench'" in result.stdout
    assert not any(tmp_path.iterdir())  # nothing ran: no log, no build output
