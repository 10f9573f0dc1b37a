"""`omnictl serve` as a user meets it: the ready message, its curl example, Ctrl-C, bad arguments."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from tests.serving.harness import FAST_TOPOLOGY, REPO, start_server, stop_server

# Longer than the suite's default deadline: `omnictl serve` started for real, up to ~7 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

SKIP_SLOW = os.environ.get("OMNICTL_SKIP_SLOW") == "1"


def run_serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "omnictl.cli.main", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_printed_curl_command_works_as_written(tmp_path: Path) -> None:
    server = start_server(str(FAST_TOPOLOGY))
    try:
        text = server.text()
        assert f"listening on {server.url}" in text
        command = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl "))
        answer = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        assert "echo: What is the capital of France?" in answer.stdout
        with wave.open(io.BytesIO((tmp_path / "answer.wav").read_bytes())) as wav:
            assert wav.getnframes() > 0  # the spoken answer
    finally:
        assert stop_server(server) == 0
    assert "omnictl serve: stopped" in server.text()


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_serve(str(FAST_TOPOLOGY), "--port", str(port), "--no-dashboard")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_a_missing_topology_is_a_clear_error(tmp_path: Path) -> None:
    result = run_serve(str(tmp_path / "nope.yaml"), "--port", "0", "--no-dashboard")
    assert result.returncode != 0
    assert "nope.yaml" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # the real quick start, about a minute; its own deadlines allow a cold first start
@pytest.mark.skipif(SKIP_SLOW, reason="OMNICTL_SKIP_SLOW=1: skips the real voice-assistant quick start")
def test_default_serve_answers_the_printed_curl_with_speech_and_bench_measures_it(tmp_path: Path) -> None:
    """The README quick start: `omnictl serve`, the curl it prints, then `omnictl bench` against it."""
    server = start_server(ready_timeout=900)
    try:
        command = next(line.strip() for line in server.text().splitlines() if line.strip().startswith("curl "))
        answer = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert answer.returncode == 0, answer.stderr
        assert re.search(r"paris", answer.stdout, re.IGNORECASE)
        with wave.open(str(tmp_path / "answer.wav")) as wav:
            assert wav.getnframes() / wav.getframerate() > 0.5  # at least half a second of speech
        bench = subprocess.run(
            [sys.executable, "-m", "omnictl.cli.main", "bench", "--url", server.url, "-n", "2", "--warmup", "0",
             "--input", "mixed", "--max-tokens", "16", "--no-progress"],
            cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert "2 / 0" in bench.stdout and "time to first audio" in bench.stdout and "thinker" in bench.stdout
    finally:
        assert stop_server(server) == 0
