"""The README's three-stage example runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_three_stage_example_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "run.py"], cwd=REPO / "examples" / "three_stages", env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "HIHI"
    assert lines[1:9] == [f"stream detokenize {c}" for c in "OMNIOMNI"]
    assert lines[9] == "result detokenize OMNIOMNI"
