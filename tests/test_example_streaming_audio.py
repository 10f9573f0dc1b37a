"""The streaming-audio example (examples/streaming_audio) runs as written: 60 s of audio
streamed into a pipeline comes back filtered, chunk by chunk, equal to the same filter
applied to the whole signal at once; and streamed at real time, it comes back while it is
still streaming in."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "streaming_audio"


def _run(*args: str, timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "run.py", *args], cwd=EXAMPLE, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack, then the failure
        stdout, stderr = child.communicate(timeout=20)
        pytest.fail(f"the example hung for {timeout:g} s; its output:\n{stdout}\n{stderr}")
    assert child.returncode == 0, stdout + stderr
    return stdout


def _figures(stdout: str) -> tuple[int, int, int]:
    """(chunks sent, filtered chunks back, of those while the input was still streaming)."""
    found = re.search(r"\((\d+) chunks of 100 ms\); (\d+) filtered chunks back, (\d+) of them while", stdout)
    assert found is not None, stdout
    sent, back, during = (int(group) for group in found.groups())
    return sent, back, during


@pytest.mark.timeout(120)
def test_a_minute_of_audio_streamed_faster_than_real_time_comes_back_filtered_and_whole() -> None:
    stdout = _run("--seconds", "60", "--speed", "0", timeout=90)
    assert _figures(stdout)[:2] == (600, 600)
    assert "output matches the filter applied to the whole signal" in stdout


@pytest.mark.timeout(120)
def test_four_seconds_of_audio_streamed_at_real_time_come_back_while_they_stream_in() -> None:
    """Four seconds, not the example's default minute: whether chunks come back while the
    input streams does not depend on its length (the minute streamed faster than real time
    above checks 600 chunks come back whole), and each second streamed at real time is a
    second of the suite's wall time spent waiting (ten took 11 s in CI); the example sizes
    its deadline by --seconds."""
    stdout = _run("--seconds", "4", timeout=90)
    sent, back, during = _figures(stdout)
    assert (sent, back) == (40, 40)
    # Streamed out as it streamed in: all but the last few chunks (the pipeline's lag, up to
    # a second of them on a loaded machine) came back before the input ended (a pipeline
    # that waited for the whole input would show 0 here).
    assert during >= 30, stdout
    assert "output matches the filter applied to the whole signal" in stdout
