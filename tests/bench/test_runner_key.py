"""``omnictl bench --url`` against a server with an API key: /health's details (where the
server writes its traces) need the key since issue 40 bug 8, so the bench sends it."""

from __future__ import annotations

import re
from pathlib import Path

from omnictl.bench.runner import _server_run_dir
from tests.serving.harness import API_KEY, ServerProcess


def test_the_bench_asks_health_for_the_run_dir_with_the_key(fast_server: ServerProcess) -> None:
    """On the run's shared fast server (tests/conftest.py), whose run folder is the one it
    printed when it started."""
    printed = re.search(r"traces in (\S+)", fast_server.text())
    assert printed, fast_server.text()
    assert _server_run_dir(fast_server.url, API_KEY) == Path(printed.group(1))
    assert _server_run_dir(fast_server.url, None) is None  # without the key the server says only ok
