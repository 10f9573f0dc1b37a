"""`/v1/realtime` on the fast test topology (no models): a topology with no `transcript`
terminal hears the audio itself, and a failing stage fails only that response."""

from __future__ import annotations

from typing import Any, Iterator

import openai
import pytest

from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.speech import chunks, collect_until_done, silence


@pytest.fixture()
def connection(server: ServerProcess) -> Iterator[Any]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with client.realtime.connect(model="fast") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text", "audio"],
                                           "audio": {"input": {"turn_detection": None}}})
        assert connection.recv().type == "session.updated"
        yield connection


def say(connection: Any, text: str) -> list[Any]:
    connection.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    connection.response.create()
    return collect_until_done(connection)


def test_without_a_transcript_terminal_the_audio_goes_to_the_pipeline(connection: Any) -> None:
    for audio in chunks(silence(500)):
        connection.input_audio_buffer.append(audio=audio)
    connection.input_audio_buffer.commit()
    connection.response.create()
    events = collect_until_done(connection)
    assert not any(e.type.startswith("conversation.item.input_audio_transcription") for e in events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "echo: audio(12000 samples at 24000 Hz)"  # the fast prep saw the committed 0.5 s itself
    spoken = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert spoken.split() == text.split()
    assert events[-1].response.status == "completed"


def test_a_failing_stage_fails_that_response_and_the_session_goes_on(connection: Any) -> None:
    done = say(connection, "please explode")[-1].response
    assert done.status == "failed" and "prep exploded on purpose" in str(done.status_details.error)
    events = say(connection, "hello again")
    assert events[-1].response.status == "completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "echo: hello again"
