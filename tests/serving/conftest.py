from __future__ import annotations

from typing import Any, Iterator

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
