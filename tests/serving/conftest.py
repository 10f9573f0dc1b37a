from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.serving.harness import API_KEY, ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def server(fast_server: ServerProcess) -> ServerProcess:
    """The fast topology, an API key, and small limits so that 413 is cheap to provoke: the
    run's one shared fast server (tests/conftest.py's ``fast_server``)."""
    return fast_server


@pytest.fixture(scope="session")
def voice_server() -> Iterator[ServerProcess]:
    """`omnictl serve` on the embedded voice assistant (real models), with an API key."""
    running = start_server("--api-key", API_KEY, ready_timeout=300)
    yield running
    code = stop_server(running)
    assert code == 0, running.text()


@pytest.fixture(scope="session")
def whisper() -> Any:
    """The Whisper model the voice assistant uses, in the test process: it judges spoken answers."""
    from omnictl.models.voice_assistant.asr import SpeechRecognizer

    return SpeechRecognizer()
