"""A stage process that dies: /health turns 503 naming it, requests fail fast, nothing hangs."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx

from tests.serving.harness import FAST_TOPOLOGY, start_server, stop_server, wait_until


def test_a_dead_stage_makes_health_503_and_requests_fail_fast() -> None:
    server = start_server(str(FAST_TOPOLOGY))
    try:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        children = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", "omnictl.stage.worker"],
                                  capture_output=True, text=True).stdout.split()
        assert len(children) == 2, "the fast topology runs two stage processes"
        os.kill(int(children[0]), signal.SIGKILL)

        def down() -> httpx.Response | None:
            response = httpx.get(server.url + "/health", timeout=10)
            return response if response.status_code == 503 else None

        body = wait_until(down).json()
        assert body["status"] == "down" and body["down"]
        response = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                              json={"messages": [{"role": "user", "content": "anyone there?"}]})
        assert response.status_code in (500, 503)
        assert response.json()["error"]["message"]
    finally:
        assert stop_server(server) == 0
