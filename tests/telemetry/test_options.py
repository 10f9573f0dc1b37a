"""Bad tracing options are refused before anything starts, naming the value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omnictl.exceptions import StartupError
from omnictl.pipeline import Pipeline
from tests.serving.harness import FAST_TOPOLOGY, REPO


def test_serve_refuses_an_endpoint_that_is_no_url_naming_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
    result = subprocess.run([sys.executable, "-m", "omnictl.cli.main", "serve", str(FAST_TOPOLOGY), "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "'collector:4318' is not an http(s) URL" in result.stderr
    assert "launching" not in result.stdout  # refused before anything starts


def test_the_python_api_checks_the_endpoint_and_needs_the_profiler() -> None:
    with pytest.raises(StartupError, match="'ftp://x' is not an http"):
        Pipeline.launch(FAST_TOPOLOGY, otlp_endpoint="ftp://x")
    with pytest.raises(StartupError, match="needs profile=True"):
        Pipeline.launch(FAST_TOPOLOGY, otlp_endpoint="http://127.0.0.1:4318", profile=False)
