"""Admission by continuity on ``/v1/realtime`` (``serve --max-underrun-ms``): while a slowed
stream plays, a response with audio is refused with the protocol's ``error`` event (code
``audio_underrun``, why, and when to retry) and fails at once; a text-only response passes."""

from __future__ import annotations

import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from tests.serving.harness import FAST_TOPOLOGY, ServerProcess, start_server, stop_server, wait_until
from tests.serving.realtime.speech import collect_until_done
from tests.serving.slow_stream import slow_stream_playing


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    running = start_server(str(FAST_TOPOLOGY), "--max-underrun-ms", "100")
    yield running
    assert stop_server(running) == 0, running.text()


def respond(connection: Any, text: str, modalities: list[str]) -> list[Any]:
    connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    connection.response.create(response={"output_modalities": modalities})
    return collect_until_done(connection)


def test_a_response_with_audio_is_refused_while_a_slow_stream_plays(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with client.realtime.connect(model="fast") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        assert connection.recv().type == "session.updated"
        with slow_stream_playing(server, words=20):  # 6 s: the text response below waits for it in the stages
            started = time.perf_counter()
            events = respond(connection, "hello there", ["audio"])
            took = time.perf_counter() - started
            errors = [e for e in events if e.type == "error"]
            assert len(errors) == 1, [e.type for e in events]
            error = errors[0].error
            assert error.code == "audio_underrun" and error.type == "rate_limit_error"
            assert "--max-underrun-ms 100" in error.message and "retry after" in error.message
            done = events[-1].response
            assert done.status == "failed" and "audio_underrun" not in str(done.status_details.error)
            assert "would make one of the" in str(done.status_details.error)
            assert not any(e.type == "response.output_audio.delta" for e in events)
            assert took < 2  # refused before anything ran (the benchmark times refusals on an idle machine)
            # a text-only response is not held by it, and the session goes on
            events = respond(connection, "hello again", ["text"])
            assert events[-1].response.status == "completed", events[-1]
            assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "echo: hello again"
            metrics = httpx.get(server.url + "/metrics", timeout=10).text
            assert 'omnictl_admission_rejections_total{reason="underrun"} 1.0' in metrics
        # once the slow stream has gone, a spoken response is admitted again
        wait_until(lambda: respond(connection, "again", ["audio"])[-1].response.status == "completed", timeout=30)
