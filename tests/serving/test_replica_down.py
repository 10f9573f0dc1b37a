"""A replica that dies: /health says degraded (200) while its process has another replica,
and healthy again once `--max-restarts` brought it back."""

from __future__ import annotations

import os
import signal

import httpx

from tests.serving.harness import ServerProcess, wait_until


def test_a_dead_replica_degrades_health_until_it_is_restarted(fast_replicas: ServerProcess) -> None:
    """On the session's replicated fast server (tests/serving/conftest.py, `--max-restarts
    1`): healthy again, with the replica restarted, before the test ends."""
    server = fast_replicas
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and sorted(health["processes"]) == ["heads#0", "heads#1", "prep"]
    victim = health["processes"]["heads#1"]
    os.kill(victim, signal.SIGKILL)

    def degraded() -> httpx.Response | None:
        response = httpx.get(server.url + "/health", timeout=10)
        return response if response.json()["status"] == "degraded" else None

    response = wait_until(degraded)
    assert response.status_code == 200
    assert list(response.json()["replicas_down"]) == ["heads#1"]
    assert "killed by SIGKILL" in response.json()["replicas_down"]["heads#1"]
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                        json={"messages": [{"role": "user", "content": "still there?"}]})
    assert answer.status_code == 200, answer.text

    def healthy() -> dict[str, object] | None:
        body = httpx.get(server.url + "/health", timeout=10).json()
        return body if body["status"] == "ok" else None

    body = wait_until(healthy, timeout=60)
    assert body["replicas_down"] == {} and body["processes"]["heads#1"] != victim
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'omnictl_process_up{group="heads",process="heads#1"} 1.0' in metrics
