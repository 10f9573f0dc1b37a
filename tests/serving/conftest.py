from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.serving.harness import API_KEY, FAST_TOPOLOGY, ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def server(fast_server: ServerProcess) -> ServerProcess:
    """The fast topology, an API key, and small limits so that 413 is cheap to provoke: the
    run's one shared fast server (tests/conftest.py's ``fast_server``)."""
    return fast_server


@pytest.fixture(scope="session")
def fast_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The fast topology with its `heads` process in two replicas, no API key, one restart
    allowed and a 30 s request timeout: shared by the tests that stop, freeze or kill one
    replica, each of which leaves it as it found it (the replica resumed, or restarted and
    the server healthy again) before it ends."""
    import yaml

    spec = yaml.safe_load(FAST_TOPOLOGY.read_text())
    spec["processes"] = {"heads": {"replicas": 2}}
    path = tmp_path_factory.mktemp("fast-replicas") / "fast-replicas.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    running = start_server(str(path), "--max-restarts", "1", "--request-timeout", "30")
    yield running
    assert stop_server(running) == 0, running.text()


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
