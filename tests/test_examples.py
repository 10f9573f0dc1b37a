"""The README's three-stage example runs as written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# Longer than the suite's default deadline: the example run as a script, up to ~14 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]


def test_three_stage_example_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # -X faulthandler: should the example hang, SIGABRT makes it print every thread's stack,
    # and the failure shows where it stopped instead of a bare per-test timeout.
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "run.py"], cwd=REPO / "examples" / "three_stages", env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        stdout, stderr = child.communicate(timeout=20)
        pytest.fail(f"the example hung for 90 s; its output:\n{stdout}\n{stderr}")
    assert child.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0] == "HIHI"
    assert lines[1:9] == [f"stream detokenize {c}" for c in "OMNIOMNI"]
    assert lines[9] == "result detokenize OMNIOMNI"
