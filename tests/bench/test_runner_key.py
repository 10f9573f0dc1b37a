"""``omnictl bench --url`` against a server with an API key: /health's details (where the
server writes its traces) need the key since issue 40 bug 8, so the bench sends it."""

from __future__ import annotations

from pathlib import Path

from omnictl.bench.runner import _server_run_dir
from tests.serving.harness import API_KEY, FAST_TOPOLOGY, start_server, stop_server


def test_the_bench_asks_health_for_the_run_dir_with_the_key(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    server = start_server(str(FAST_TOPOLOGY), "--api-key", API_KEY, "--run-dir", str(run_dir))
    try:
        assert _server_run_dir(server.url, API_KEY) == run_dir
        assert _server_run_dir(server.url, None) is None  # without the key the server says only ok
    finally:
        assert stop_server(server) == 0, server.text()
