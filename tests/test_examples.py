"""The README's three-stage example runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Longer than the suite's default deadline: the example run as a script, up to ~14 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

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
