from __future__ import annotations

from typing import Iterator

import pytest

from tests.serving.harness import API_KEY, FAST_TOPOLOGY, ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """The fast topology, an API key, and small limits so that 413 is cheap to provoke."""
    running = start_server(str(FAST_TOPOLOGY), "--api-key", API_KEY, "--max-body-mb", "0.25", "--max-audio-mb", "0.05", "--body-timeout", "2")
    yield running
    code = stop_server(running)  # Ctrl-C must shut everything down cleanly
    assert code == 0, running.text()
    assert "omnictl serve: stopped" in running.text()
