"""Off by default and free when off: a server without an OTLP endpoint never imports
opentelemetry, even when a request carries a traceparent. Checked in a fresh interpreter
that serves one request in-process (this test process has imported opentelemetry already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE_ONE_REQUEST = r'''
import asyncio, json, sys
import httpx
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import run_server

endpoint = sys.argv[1] or None
answers = []

async def on_ready(listening):
    async with httpx.AsyncClient() as client:
        response = await client.post(
            listening.url + "/v1/chat/completions", timeout=30,
            headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            json={"messages": [{"role": "user", "content": "hello"}]})
    answers.append(response.status_code)
    listening.stop()

config = ServeConfig(topology="tests/serving/fast.yaml", http=HttpConfig(port=0)).launching(
    run_dir=sys.argv[2], otlp_endpoint=endpoint)
asyncio.run(run_server(config, on_ready, handle_signals=False))
print(json.dumps({"answers": answers, "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
'''


def serve_one_request(endpoint: str, run_dir: Path) -> subprocess.Popen[str]:
    """A fresh interpreter serving one request; :func:`outcome` reads what it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return subprocess.Popen([sys.executable, "-c", SERVE_ONE_REQUEST, endpoint, str(run_dir)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str]) -> dict[str, list]:  # type: ignore[type-arg]
    try:
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
def test_without_an_endpoint_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    # the two interpreters at once: their start-ups (most of the test) overlap
    off, on = serve_one_request("", tmp_path / "off"), serve_one_request("http://127.0.0.1:9", tmp_path / "on")
    assert outcome(off) == {"answers": [200], "otel": []}
    # The same check sees the import when the endpoint is set (the traceparent is parsed).
    served = outcome(on)
    assert served["answers"] == [200] and "opentelemetry.trace" in served["otel"]
