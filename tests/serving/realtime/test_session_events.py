"""A realtime session's handling of each client event, in the test process: the session
object that drives a WebSocket or a WebRTC call, fed decoded client events, against a
scripted pipeline; what it sends is read back as the JSON a client gets. Turn detection
is off (``turn_detection: null``) unless a test is about it: no VAD model is loaded."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any, Awaitable, Callable

import numpy as np
import pytest

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.exceptions import Overloaded, PipelineDead
from omnictl.outputs import AudioChunk, TextDelta, TextResult, Transcript
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session import MIN_COMMIT_MS, RealtimeSession, Settings
from omnictl.serving.state import ServingState
from tests.serving.scripted import CHAT_ONLY, EVERY_ENDPOINT, ScriptedPipeline, error_event, text_events, tone
from tests.support.wait import eventually

RATE = 24_000


def pcm16(seconds: float, value: int = 1000) -> bytes:
    return np.full(int(seconds * RATE), value, "<i2").tobytes()


class Client:
    """A session and what it sent, as a client reads it."""

    def __init__(self, pipeline: ScriptedPipeline, limits: Limits = Limits(), vad: bool = False,
                 intent: str | None = None) -> None:
        self.pipeline = pipeline
        self.state = ServingState(model_name="m", pipeline=pipeline, limits=limits)
        self.sent: list[dict[str, Any]] = []
        self.session = RealtimeSession(self.state, pipeline, lambda e: self.sent.append(json.loads(ev.encode(e))),
                                       "m", silero=lambda: None, intent=intent)  # type: ignore[arg-type,return-value]
        if not vad:
            self.session.settings.vad = None
            self.session._reset_vad()

    async def send(self, event: dict[str, Any]) -> None:
        await self.session.handle(ev.decode_client_event(json.dumps(event)))

    async def refused(self, event: dict[str, Any]) -> ev.EventError:
        with pytest.raises(ev.EventError) as caught:
            await self.send(event)
        return caught.value

    def types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == kind]

    async def settle(self) -> None:
        """Until every task the session started (transcriptions, responses) is done."""
        while self.session._tasks:
            await asyncio.gather(*list(self.session._tasks), return_exceptions=True)


async def said(client: Client, text: str = "hi") -> None:
    """A user text item: what a response answers."""
    await client.send({"type": "conversation.item.create", "item": {
        "role": "user", "content": [{"type": "input_text", "text": text}]}})
    client.sent.clear()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 5))


# --- session.update ----------------------------------------------------------------------


def test_session_update_sets_what_it_names_and_answers_the_whole_session() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        await client.send({"type": "session.update", "event_id": "e1", "session": {
            "instructions": "be brief", "output_modalities": ["text", "text"], "max_output_tokens": 50,
            "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None, "echo_guard": False},
                      "output": {"voice": "amy", "format": {"type": "audio/pcma"}}}}})
        [updated] = client.of("session.updated")
        session = updated["session"]
        assert session["instructions"] == "be brief" and session["output_modalities"] == ["text"]
        assert session["max_output_tokens"] == 50 and session["model"] == "m"
        assert session["audio"]["input"]["format"]["type"] == "audio/pcmu"
        assert session["audio"]["input"]["turn_detection"] is None
        assert session["audio"]["input"]["echo_guard"] is False
        assert session["audio"]["input"]["transcription"] == {"model": "hear"}  # the topology's recognizer
        assert session["audio"]["output"]["voice"] == "amy"
        assert session["audio"]["output"]["format"]["type"] == "audio/pcma"
        assert client.session.settings.voice == "amy" and client.session.echo.enabled is False
        await client.send({"type": "session.update", "session": {"max_output_tokens": "inf"}})
        assert client.session.settings.max_output_tokens == "inf"
        await client.send({"type": "session.update", "session": {"audio": {"input": {"transcription": None}}}})
        assert client.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"] is None

    run(scenario)


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"type": "translation"}, "unsupported_session_type", "session.type"),
        ({"output_modalities": []}, "invalid_value", "session.output_modalities"),
        ({"max_output_tokens": 0}, "invalid_value", "session.max_output_tokens"),
        ({"tools": [{"type": "function", "name": "f"}]}, "invalid_value", "session.tools"),
        ({"tool_choice": "required"}, "invalid_value", "session.tool_choice"),
        ({"audio": {"input": {"format": {"type": "audio/flac"}}}}, "unsupported_audio_format", "session.audio.input.format.type"),
        # the OpenAI Realtime protocol's ranges (each once accepted as it came)
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": -1}}}}, "invalid_value",
         "session.audio.input.turn_detection.silence_duration_ms"),
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "prefix_padding_ms": 10**9}}}}, "invalid_value",
         "session.audio.input.turn_detection.prefix_padding_ms"),
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}}, "invalid_value",
         "session.audio.input.turn_detection.threshold"),
        ({"temperature": 1e308}, "invalid_value", "session.temperature"),
        ({"temperature": 0.1}, "invalid_value", "session.temperature"),
        ({"audio": {"output": {"speed": 100}}}, "invalid_value", "session.audio.output.speed"),
        ({"audio": {"output": {"voice": "../../x"}}}, "invalid_value", "session.audio.output.voice"),
        # a refused field changes none of the others sent with it
        ({"instructions": "x", "audio": {"output": {"voice": "alloy", "speed": 0.1}}}, "invalid_value",
         "session.audio.output.speed"),
        ({"instructions": "x", "max_output_tokens": 5, "temperature": 9}, "invalid_value", "session.temperature"),
    ],
)
def test_session_update_refusals_name_the_field_and_change_nothing(session: dict[str, Any], code: str, param: str) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        before = client.session.session_object()
        error = await client.refused({"type": "session.update", "event_id": "e7", "session": session})
        assert (error.code, error.param, error.event_id) == (code, param, "e7")
        assert client.session.session_object() == before and client.sent == []

    run(scenario)


def test_values_in_the_protocol_s_ranges_are_taken_and_temperature_reaches_the_pipeline() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY)
        client = Client(pipeline)
        await client.send({"type": "session.update", "session": {"temperature": 0.6, "audio": {
            "input": {"turn_detection": {"type": "server_vad", "threshold": 1, "prefix_padding_ms": 0,
                                         "silence_duration_ms": 0}},
            "output": {"speed": 1.5, "voice": "en_US-amy-medium"}}}})
        session = client.of("session.updated")[-1]["session"]
        assert session["audio"]["input"]["turn_detection"]["threshold"] == 1
        assert session["audio"]["output"]["voice"] == "en_US-amy-medium"
        assert session["audio"]["output"]["speed"] == 1.5  # taken, and said so
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        await client.send({"type": "response.create", "response": {"temperature": 1.2}})
        await client.settle()
        assert [inputs.sampling.temperature for inputs, *_ in pipeline.submitted] == [0.6, 1.2]
        # the speed reaches the pipeline with the request, where the TTS stage applies it
        assert [inputs.speed for inputs, *_ in pipeline.submitted] == [1.5, 1.5]
        assert [inputs.params()["speed"] for inputs, *_ in pipeline.submitted] == [1.5, 1.5]
        error = await client.refused({"type": "response.create", "event_id": "e9", "response": {"temperature": 2}})
        assert (error.code, error.param, error.event_id) == ("invalid_value", "response.temperature", "e9")
        assert "0.6 to 1.2" in error.message and len(pipeline.submitted) == 2

    run(scenario)


def test_a_topology_that_lists_its_voices_takes_only_those_and_openai_s_names(tmp_path: Any) -> None:
    from tests.serving.test_voices_and_playground import voiced

    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=voiced(tmp_path, module="voiced_realtime")))
        for voice in ("nora", "marin"):
            await client.send({"type": "session.update", "session": {"audio": {"output": {"voice": voice}}}})
            assert client.of("session.updated")[-1]["session"]["audio"]["output"]["voice"] == voice
        error = await client.refused({"type": "session.update", "session": {"audio": {"output": {"voice": "zed"}}}})
        assert error.param == "session.audio.output.voice" and "'zed'" in error.message and "nora" in error.message
        assert client.session.settings.voice == "marin"

    run(scenario)


def test_tool_choice_auto_or_none_and_no_tools_ask_for_nothing() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        for session in ({"tools": []}, {"tool_choice": "auto"}, {"tool_choice": "none"}):
            await client.send({"type": "session.update", "session": session})
        assert len(client.of("session.updated")) == 3

    run(scenario)


def test_a_transcription_session_needs_a_transcript_terminal() -> None:
    async def scenario() -> None:
        chat_only = Client(ScriptedPipeline(topology=CHAT_ONLY))
        error = await chat_only.refused({"type": "session.update", "session": {"type": "transcription"}})
        assert error.code == "unsupported_session_type" and "topology 'fast' has no terminal" in error.message
        error = await chat_only.refused({"type": "session.update",
                                         "session": {"audio": {"input": {"transcription": {"model": "x"}}}}})
        assert error.param == "session.audio.input.transcription"
        assert chat_only.session.session_object().audio["input"]["transcription"] is None

        client = Client(ScriptedPipeline())
        await client.send({"type": "session.update", "session": {"type": "transcription"}})
        [updated] = client.of("session.updated")
        assert updated["session"]["type"] == "transcription" and "model" not in updated["session"]
        error = await client.refused({"type": "response.create"})
        assert error.code == "invalid_request" and "only transcribes" in error.message
        by_intent = Client(ScriptedPipeline(), intent="transcription")
        assert by_intent.session.settings.type == "transcription"

    run(scenario)


# --- the input audio buffer --------------------------------------------------------------


def append(audio: bytes, event_id: str | None = None) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "event_id": event_id, "audio": base64.b64encode(audio).decode()}


def test_the_transcription_language_a_session_names_is_the_one_its_turns_are_transcribed_in() -> None:
    heard = Transcript(text="bonjour", duration=0.25)

    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: [RequestEvent(RequestEventKind.RESULT, "hear", heard)])
        client = Client(pipeline)
        client.state.live_transcriber = pipeline  # type: ignore[assignment]  # a live transcriber on the server
        assert client.session._live_pipeline() is pipeline
        await client.send({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": None, "transcription": {"model": "whisper-1", "language": "FR"}}}}})
        assert client.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"] == {
            "model": "hear", "language": "fr"}
        assert client.session._live_pipeline() is None  # it decodes its own language: turns are transcribed whole
        for _ in range(2):  # a turn, and the next: the language stays
            await client.send(append(pcm16(0.25)))
            await client.send({"type": "input_audio_buffer.commit"})
            await client.settle()
        assert [(inputs.language, modalities) for inputs, modalities, *_ in pipeline.submitted] == [
            ("fr", ["transcript"])] * 2
        await client.send({"type": "session.update", "session": {"audio": {"input": {
            "transcription": {"model": "whisper-1"}}}}})  # a transcription object without one: the default again
        assert client.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"] == {"model": "hear"}
        assert client.session.settings.language is None

    run(scenario)


def test_appended_audio_is_committed_as_a_user_item_and_transcribed() -> None:
    heard = Transcript(text="hello there", duration=0.25)

    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: [RequestEvent(RequestEventKind.RESULT, "hear", heard)])
        client = Client(pipeline)
        await client.send(append(pcm16(0.15)))
        await client.send(append(pcm16(0.10)))
        assert len(client.session.buffer) == int(0.25 * RATE) * 2
        assert client.session.audio_ms == pytest.approx(250)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        assert client.types()[:2] == ["input_audio_buffer.committed", "conversation.item.added"]
        item_id = client.of("input_audio_buffer.committed")[0]["item_id"]
        assert client.of("conversation.item.added")[0]["item"]["id"] == item_id
        [(inputs, modalities, *_)] = pipeline.submitted
        assert modalities == ["transcript"]
        [audio] = inputs.last_user_message().audio()
        assert audio.samples.size == int(0.25 * RATE) and audio.sample_rate == RATE
        assert audio.samples[0] == pytest.approx(1000 / 32768)
        [delta] = client.of("conversation.item.input_audio_transcription.delta")
        [completed] = client.of("conversation.item.input_audio_transcription.completed")
        assert delta["delta"] == completed["transcript"] == "hello there" and completed["item_id"] == item_id
        assert completed["usage"] == {"type": "duration", "seconds": 0.25}
        assert client.of("conversation.item.done")[-1]["item"]["content"][0]["transcript"] == "hello there"
        turn = client.session.conversation.find(item_id)
        assert turn is not None and turn.text == "hello there" and turn.audio is None  # the transcript replaces it
        assert client.session.buffer == bytearray() and client.state.active == {}
        assert client.state.metrics.count("completed") == 1

    run(scenario)


def test_a_failed_transcription_is_an_error_event_and_keeps_the_audio() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: [error_event("asr crashed", stage="hear")])
        client = Client(pipeline)
        await client.send(append(pcm16(0.2)))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        [error] = client.of("error")
        assert error["error"]["code"] == "transcription_failed" and "asr crashed" in error["error"]["message"]
        assert error["error"]["type"] == "server_error"
        turn = client.session.conversation.turns[-1]
        assert turn.audio is not None and turn.transcribed.is_set()
        assert client.state.metrics.count("failed") == 1 and client.state.active == {}
        refusing = ScriptedPipeline()
        refusing.refuse = PipelineDead("gone")
        client2 = Client(refusing)
        await client2.send(append(pcm16(0.2)))
        await client2.send({"type": "input_audio_buffer.commit"})
        await client2.settle()
        assert "transcribing item" in client2.of("error")[0]["error"]["message"] and client2.state.active == {}

    run(scenario)


def test_a_topology_without_a_recognizer_keeps_the_audio_for_the_answer() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY)
        client = Client(pipeline)
        await client.send(append(pcm16(0.2)))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        assert pipeline.submitted == [] and client.session.conversation.turns[-1].transcribed.is_set()
        assert client.of("conversation.item.input_audio_transcription.completed") == []

    run(scenario)


def test_commit_needs_a_tenth_of_a_second_and_clear_empties_the_buffer() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        await client.send(append(pcm16(MIN_COMMIT_MS / 1000 - 0.01)))
        error = await client.refused({"type": "input_audio_buffer.commit", "event_id": "c1"})
        assert error.code == "input_audio_buffer_commit_empty" and error.event_id == "c1"
        assert "holds 90 ms of audio; at least 100 ms" in error.message
        await client.send({"type": "input_audio_buffer.clear"})
        assert client.types() == ["input_audio_buffer.cleared"] and client.session.buffer == bytearray()
        await client.send(append(pcm16(MIN_COMMIT_MS / 1000)))
        await client.send({"type": "input_audio_buffer.commit"})  # exactly the minimum
        assert "input_audio_buffer.committed" in client.types()

    run(scenario)


@pytest.mark.parametrize(
    ("audio", "code"),
    [
        ("not base64!", "invalid_base64"),
        (base64.b64encode(b"\x01\x02\x03").decode(), "invalid_audio"),
    ],
)
def test_an_append_that_is_not_pcm16_is_refused(audio: str, code: str) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        error = await client.refused({"type": "input_audio_buffer.append", "event_id": "a1", "audio": audio})
        assert error.code == code and error.param == "audio" and error.event_id == "a1"
        assert client.session.buffer == bytearray()

    run(scenario)


def test_the_buffer_is_bounded_and_so_is_the_rate_audio_arrives() -> None:
    async def scenario() -> None:
        limits = Limits(max_realtime_buffer_bytes=int(0.5 * RATE) * 2)
        client = Client(ScriptedPipeline(), limits)
        await client.send(append(pcm16(0.5)))  # exactly the limit
        error = await client.refused(append(pcm16(0.01)))
        assert error.code == "input_audio_buffer_too_large" and "limited to 24000 bytes (0 s of audio)" in error.message
        with pytest.raises(ev.EventError) as fed:
            await client.session.feed(pcm16(0.01))
        assert fed.value.code == "input_audio_buffer_too_large"

        fast = Client(ScriptedPipeline(), Limits(realtime_audio_burst_s=0.3, realtime_audio_speed=1.0))
        await fast.send(append(pcm16(0.2)))
        error = await fast.refused(append(pcm16(0.2)))
        assert error.code == "input_audio_rate_exceeded"
        assert "at most 1x real time after the first 0.3 s" in error.message
        assert len(fast.session.buffer) == int(0.2 * RATE) * 2  # the refused append was dropped

    run(scenario)


def test_a_session_transcoding_g711_input_holds_pcm16() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}})
        await client.send(append(bytes(800)))  # 0.1 s of 8 kHz mu-law: 0.1 s of 24 kHz pcm16
        assert len(client.session.buffer) == int(0.1 * RATE) * 2

    run(scenario)


# --- conversation items ------------------------------------------------------------------


def test_items_created_by_the_client() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        await client.send({"type": "conversation.item.create", "item": {
            "id": "u1", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await client.send({"type": "conversation.item.create", "item": {
            "id": "a1", "role": "assistant", "content": [{"type": "output_audio", "transcript": "hello"}]}})
        assert client.types() == ["conversation.item.added", "conversation.item.done"] * 2
        assert client.sent[2]["previous_item_id"] == "u1"
        assistant = client.session.conversation.find("a1")
        assert assistant is not None and assistant.text == "hello" and assistant.spoken
        audio = base64.b64encode(pcm16(0.1)).decode()
        await client.send({"type": "conversation.item.create", "item": {
            "id": "u2", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}})
        spoken = client.session.conversation.find("u2")
        assert spoken is not None and spoken.audio is not None and spoken.audio.size == int(0.1 * RATE)
        await client.send({"type": "conversation.item.retrieve", "item_id": "u2"})
        [retrieved] = client.of("conversation.item.retrieved")
        back = np.frombuffer(base64.b64decode(retrieved["item"]["content"][0]["audio"]), "<i2")
        assert back.size == int(0.1 * RATE) and np.abs(back.astype(int) - 1000).max() <= 1
        await client.send({"type": "conversation.item.delete", "item_id": "u1"})
        assert [e["item_id"] for e in client.of("conversation.item.deleted")] == ["u1"]
        assert client.session.conversation.find("u1") is None

    run(scenario)


@pytest.mark.parametrize(
    ("item", "param", "code", "message"),
    [
        ({"role": "user", "content": []}, "item.content", "invalid_value",
         "item.content must hold exactly one part, got 0"),
        ({"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
         "item.content", "invalid_value", "item.content must hold exactly one part, got 2"),
        ({"role": "system", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].type",
         "invalid_value", "item.content[0].type: a system item takes input_text, got 'input_audio'"),
        ({"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}, "item.content[0].type",
         "invalid_value", "item.content[0].type: a assistant item takes output_text, output_audio, got 'input_text'"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": "@@"}]}, "item.content[0].audio",
         "invalid_base64", "item.content[0].audio is not valid base64 ("),
        ({"role": "user", "content": [{"type": "input_audio", "audio": base64.b64encode(b"\x01").decode()}]},
         "item.content[0].audio", "invalid_audio", "item.content[0].audio must be audio/pcm at 24000 Hz (the session's "
         "input format), up to 5760000 bytes, got 1 bytes"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": base64.b64encode(b"\x01\x02\x03").decode()}]},
         "item.content[0].audio", "invalid_audio", "got 3 bytes"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].audio",
         "invalid_audio", "got 0 bytes"),
    ],
)
def test_item_create_refusals(item: dict[str, Any], param: str, code: str, message: str) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        error = await client.refused({"type": "conversation.item.create", "event_id": "i1", "item": item})
        assert (error.param, error.code, error.event_id) == (param, code, "i1")
        assert error.message.startswith(message) or error.message.endswith(message), error.message
        assert client.session.conversation.turns == [] and client.sent == []

    run(scenario)


def test_the_smallest_audio_item_is_one_sample() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        one = base64.b64encode(b"\x01\x00").decode()
        await client.send({"type": "conversation.item.create",
                           "item": {"role": "user", "content": [{"type": "input_audio", "audio": one}]}})
        assert client.types() == ["conversation.item.added"]

    run(scenario)


def test_an_item_id_is_unique_and_audio_is_bounded() -> None:
    async def scenario() -> None:
        limits = Limits(max_realtime_buffer_bytes=100)
        client = Client(ScriptedPipeline(topology=CHAT_ONLY), limits)
        text = {"role": "user", "content": [{"type": "input_text", "text": "hi"}], "id": "x"}
        await client.send({"type": "conversation.item.create", "item": text})
        error = await client.refused({"type": "conversation.item.create", "item": text})
        assert (error.param, error.code, error.message) == ("item.id", "invalid_value", "item.id 'x' is already in the conversation")
        long_id = {**text, "id": "y" * 70}
        await client.send({"type": "conversation.item.create", "item": long_id})
        error = await client.refused({"type": "conversation.item.create", "item": long_id})
        assert error.message == f"item.id {'y' * 64!r}... (6 more characters) is already in the conversation"
        big = base64.b64encode(bytes(102)).decode()
        error = await client.refused({"type": "conversation.item.create",
                                      "item": {"role": "user", "content": [{"type": "input_audio", "audio": big}]}})
        assert "up to 100 bytes, got 102 bytes" in error.message
        ok = base64.b64encode(bytes(100)).decode()
        await client.send({"type": "conversation.item.create",
                           "item": {"role": "user", "content": [{"type": "input_audio", "audio": ok}]}})

    run(scenario)


@pytest.mark.parametrize("verb", ["truncate", "delete", "retrieve"])
def test_an_unknown_item_is_not_found(verb: str) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        event: dict[str, Any] = {"type": f"conversation.item.{verb}", "item_id": "nope", "event_id": "v"}
        if verb == "truncate":
            event |= {"content_index": 0, "audio_end_ms": 0}
        error = await client.refused(event)
        assert error.code == "item_not_found" and error.param == "item_id"
        assert error.message == f"conversation.item.{verb}: no item 'nope' in the conversation"

    run(scenario)


def test_truncate_cuts_a_spoken_answer_and_only_that() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        await client.send({"type": "conversation.item.create", "item": {
            "id": "u", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        error = await client.refused({"type": "conversation.item.truncate", "item_id": "u", "content_index": 0,
                                      "audio_end_ms": 0})
        assert error.param == "item_id" and "not an assistant audio message" in error.message
        turn = client.session.conversation.text("assistant", "one two")
        turn.spoken = True
        from omnictl.serving.realtime.turns import Segment

        turn.segments = [Segment(0, 500, "one"), Segment(500, 1000, "two")]
        error = await client.refused({"type": "conversation.item.truncate", "item_id": turn.id, "content_index": 1,
                                      "audio_end_ms": 0})
        assert error.param == "content_index" and "got 1" in error.message
        error = await client.refused({"type": "conversation.item.truncate", "item_id": turn.id, "content_index": 0,
                                      "audio_end_ms": 1002})
        assert error.param == "audio_end_ms" and "outside the item's audio (0 to 1000 ms)" in error.message
        await client.send({"type": "conversation.item.truncate", "item_id": turn.id, "content_index": 0,
                           "audio_end_ms": 600})
        [truncated] = client.of("conversation.item.truncated")
        assert truncated["item_id"] == turn.id and truncated["audio_end_ms"] == 600
        assert turn.truncated_ms == 600

    run(scenario)


# --- responses ---------------------------------------------------------------------------


def spoken_answer(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
    chunk = AudioChunk(tone(0.05), 16_000, transcript="Hello ")
    second = AudioChunk(tone(0.05), 16_000, transcript="there.")
    return [
        RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("Hello ")),
        RequestEvent(RequestEventKind.STREAM, "speak", chunk),
        RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("there.")),
        RequestEvent(RequestEventKind.STREAM, "speak", second),
        RequestEvent(RequestEventKind.RESULT, "answer", TextResult("Hello there.", prompt_tokens=7, completion_tokens=3)),
    ]


def test_a_spoken_response_streams_audio_and_its_words_then_done() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer)
        client = Client(pipeline)
        await client.send({"type": "conversation.item.create", "item": {
            "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        client.sent.clear()
        await client.send({"type": "response.create", "event_id": "r1"})
        await client.settle()
        types = client.types()
        assert types[:4] == ["response.created", "conversation.item.added", "response.output_item.added",
                             "response.content_part.added"]
        assert types[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                              "response.content_part.done", "response.output_item.done", "conversation.item.done",
                              "response.done"]
        deltas = client.of("response.output_audio.delta")
        assert len(deltas) == 2 and all(base64.b64decode(d["delta"]) for d in deltas)
        assert len(base64.b64decode(deltas[0]["delta"])) == int(0.05 * RATE) * 2  # resampled to 24 kHz pcm16
        deltas = [d["delta"] for d in client.of("response.output_audio_transcript.delta")]
        assert deltas == ["Hello ", "there."]  # one space between the pieces, never two
        assert "".join(deltas) == "Hello there."  # what a client joining them reads: the transcript below
        assert client.of("response.output_text.delta") == []  # audio was asked for, not text
        [done] = client.of("response.done")
        response = done["response"]
        assert response["status"] == "completed" and response["usage"]["total_tokens"] == 10
        assert response["usage"]["input_tokens"] == 7 and response["usage"]["output_tokens"] == 3
        assert response["output"][0]["content"][0]["transcript"] == "Hello there."
        [(inputs, modalities, *_)] = pipeline.submitted
        assert modalities == ["audio", "text"] and inputs.messages[-1].parts[0].text == "hi"
        answer = client.session.conversation.turns[-1]
        assert answer.role == "assistant" and answer.text == "Hello there." and answer.spoken
        assert client.session.response is None and client.state.active == {}
        assert client.state.metrics.count("completed") == 1

    run(scenario)


def test_a_text_response_sends_text_deltas_with_the_sessions_instructions_and_limit() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a", "b"]))
        client = Client(pipeline)
        await said(client)
        await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "instructions": "terse",
                                                                  "max_output_tokens": 9}})
        await client.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        await client.settle()
        assert [d["delta"] for d in client.of("response.output_text.delta")] == ["a ", "b"]
        assert client.of("response.output_text.done")[0]["text"] == "a b"
        assert client.of("response.output_audio.delta") == []
        [(inputs, modalities, *_)] = pipeline.submitted
        assert modalities == ["text"] and inputs.sampling.max_tokens == 4
        assert inputs.messages[0].role == "system" and inputs.messages[0].parts[0].text == "terse"
        await client.send({"type": "response.create", "response": {"instructions": "wordy"}})
        await client.settle()
        inputs = pipeline.submitted[-1][0]
        assert inputs.sampling.max_tokens == 9 and inputs.messages[0].parts[0].text == "wordy"

    run(scenario)


def test_a_response_refused_or_failing_is_a_failed_response_done() -> None:
    async def scenario() -> None:
        failing = ScriptedPipeline(topology=CHAT_ONLY,
                                   script=lambda inputs, modalities: [error_event("llm crashed", stage="answer")])
        client = Client(failing)
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        [done] = client.of("response.done")
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["message"] == "stage 'answer': llm crashed"
        assert client.state.metrics.count("failed") == 1 and client.state.active == {}

        overloaded = ScriptedPipeline(topology=CHAT_ONLY)
        overloaded.refuse = Overloaded("at the limit", retry_after=3)
        busy = Client(overloaded)
        await said(busy)
        await busy.send({"type": "response.create"})
        await busy.settle()
        assert busy.of("error")[0]["error"]["code"] == "overloaded"
        assert "retry after 3 s" in busy.of("error")[0]["error"]["message"]
        assert busy.of("response.done")[0]["response"]["status"] == "failed"

        dead = ScriptedPipeline(topology=CHAT_ONLY)
        dead.refuse = PipelineDead("gone")
        down = Client(dead)
        await said(down)
        await down.send({"type": "response.create"})
        await down.settle()
        details = down.of("response.done")[0]["response"]["status_details"]
        assert details["error"]["message"] == "the pipeline refused the response: gone"

        frozen = Client(ScriptedPipeline(topology=CHAT_ONLY))
        frozen.state.unresponsive = ["heads"]
        await said(frozen)
        await frozen.send({"type": "response.create"})
        await frozen.settle()
        assert "stage process 'heads' is not responding" in frozen.of("response.done")[0]["response"][
            "status_details"]["error"]["message"]
        assert frozen.pipeline.submitted == []

    run(scenario)


def test_text_a_stage_gives_with_a_lone_surrogate_still_ends_in_response_done() -> None:
    """It once raised while encoding the delta, and again in the handler's closing events:
    response.created, then nothing."""
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a\ud800", "b"]))
        client = Client(pipeline)
        await said(client)
        await client.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
        await client.send({"type": "response.create"})
        await client.settle()
        assert client.types()[-1] == "response.done", client.types()
        [done] = client.of("response.done")
        assert done["response"]["status"] == "completed"
        assert "".join(d["delta"] for d in client.of("response.output_text.delta")) == "a\ufffd b"

    run(scenario)


def test_any_failure_after_response_created_ends_in_a_failed_response_done(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        send = client.session.send

        def failing(event: ev.ServerEvent) -> None:  # the transport breaks on one closing event
            if isinstance(event, ev.ContentPartDone):
                raise RuntimeError("the part could not be sent")
            send(event)

        client.session.send = failing
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        [created] = client.of("response.created")
        [done] = client.of("response.done")
        assert done["response"]["id"] == created["response"]["id"]
        assert done["response"]["status"] == "failed"
        assert "could not finish this response (RuntimeError)" in done["response"]["status_details"]["error"]["message"]
        assert client.session.response is None  # and the next one may start

    caplog.set_level(logging.ERROR, logger="omnictl.serving.realtime")
    run(scenario)
    [logged] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "closing its item failed" in logged.getMessage()  # once, naming the response


def test_one_response_at_a_time_and_cancel_stops_it() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a"])[:1],
                                    hold=True)
        client = Client(pipeline)
        error = await client.refused({"type": "response.cancel", "event_id": "x"})
        assert error.code == "response_cancel_not_active" and error.message == "there is no response in progress to cancel"
        await said(client)
        await client.send({"type": "response.create"})
        while not pipeline.requests:
            await asyncio.sleep(0.001)
        error = await client.refused({"type": "response.create"})
        assert error.code == "conversation_already_has_active_response"
        run_id = client.session.response[0].id  # type: ignore[index]
        error = await client.refused({"type": "response.cancel", "response_id": "resp_other"})
        assert error.param == "response_id" and error.message == "response resp_other is not in progress"
        await client.send({"type": "response.cancel", "response_id": run_id})
        [done] = client.of("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert pipeline.aborts == list(pipeline.requests) and client.session.response is None
        assert client.state.active == {} and client.state.metrics.count("aborted") == 1

    run(scenario)


def test_clearing_the_output_audio_cancels_the_response_sending_it() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer, hold=True)
        client = Client(pipeline)
        error = await client.refused({"type": "output_audio_buffer.clear"})
        assert error.code == "response_cancel_not_active"
        await said(client)
        await client.send({"type": "response.create"})
        while not client.of("response.output_audio.delta"):
            await asyncio.sleep(0.001)
        await client.send({"type": "output_audio_buffer.clear"})
        assert client.types()[-1] == "output_audio_buffer.cleared"
        assert client.of("response.done")[0]["response"]["status"] == "cancelled"

    run(scenario)


def test_closing_the_session_aborts_what_it_started() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
        client = Client(pipeline)
        await client.send(append(pcm16(0.2)))
        await client.send({"type": "input_audio_buffer.commit"})  # a transcription held in the pipeline
        await client.send({"type": "response.create"})
        while len(pipeline.requests) < 1:
            await asyncio.sleep(0.001)
        await client.session.close()
        assert client.session._tasks == set() or all(t.done() for t in client.session._tasks)
        assert set(pipeline.aborts) == set(pipeline.requests)
        assert client.state.active == {}

    run(scenario)


def test_settings_sampling_reads_the_limit() -> None:
    settings = Settings()
    assert settings.sampling().max_tokens is None
    assert settings.sampling(5).max_tokens == 5
    settings.max_output_tokens = 12
    assert settings.sampling().max_tokens == 12 and settings.sampling("inf").max_tokens is None


# --- server VAD: turns found in the audio -------------------------------------------------


@pytest.fixture(scope="module")
def spoken() -> bytes:
    """A spoken question between silences, as pcm16 at 24 kHz (what a client appends)."""
    from benchmarks.eval.samples import sample_question
    from omnictl.inputs import resample

    speech, rate = sample_question("spider_legs")
    audio = resample(speech, rate, RATE)
    pad = np.zeros(RATE // 2, np.float32)
    return (np.clip(np.concatenate([pad, audio, pad, pad]), -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def silero() -> Any:
    from omnictl.serving.realtime.vad import SileroModel

    return SileroModel()


async def speak(client: Client, audio: bytes, piece: int = 4800) -> None:
    for start in range(0, len(audio), piece):  # 0.1 s at a time, as a microphone delivers it
        await client.send(append(audio[start : start + piece]))


def vad_client(pipeline: ScriptedPipeline, silero: Any, **vad: Any) -> Client:
    client = Client(pipeline, vad=True)
    client.session._silero = lambda: silero
    client.session.settings.vad = ev.ServerVad(silence_duration_ms=400, **vad)
    client.session._reset_vad()
    return client


def test_a_turn_found_by_server_vad_is_committed_and_answered(spoken: bytes, silero: Any) -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["yes"]))
        client = vad_client(pipeline, silero)
        await speak(client, spoken)
        await client.settle()
        types = client.types()
        assert types[:4] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "input_audio_buffer.committed", "conversation.item.added"]
        started, stopped = client.of("input_audio_buffer.speech_started")[0], client.of(
            "input_audio_buffer.speech_stopped")[0]
        assert started["item_id"] == stopped["item_id"] == client.of("input_audio_buffer.committed")[0]["item_id"]
        assert 500 <= started["audio_start_ms"] <= 1100  # the voice starts ~0.7 s in (0.5 s of padding, then the sample's own 0.2 s)
        assert stopped["audio_end_ms"] > started["audio_start_ms"] + 1000
        assert "response.created" in types and client.of("response.done")[0]["response"]["status"] == "completed"
        [(inputs, *_)] = pipeline.submitted  # the committed turn, as audio (no recognizer here)
        [audio] = inputs.last_user_message().audio()
        assert audio.samples.size / RATE > 1.0
        # between turns the buffer keeps only what prefix padding may need
        assert len(client.session.buffer) <= int((300 + 100) * RATE / 1000) * 2

    run(scenario)


def test_speech_over_an_answer_cancels_it_barge_in(spoken: bytes, silero: Any) -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a"])[:1],
                                    hold=True)
        client = vad_client(pipeline, silero, create_response=False)
        await said(client)
        client.session.echo.enabled = False  # a client that cancels its own echo
        await client.send({"type": "response.create"})
        while not pipeline.requests:
            await asyncio.sleep(0.001)
        await speak(client, spoken)
        await client.settle()
        [done] = client.of("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        assert pipeline.aborts == list(pipeline.requests)
        assert "input_audio_buffer.committed" in client.types()  # the new turn is kept
        assert len(pipeline.submitted) == 1  # create_response off: no answer started by itself

    run(scenario)


def test_no_barge_in_when_interrupt_response_is_off(spoken: bytes, silero: Any) -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a"])[:1],
                                    hold=True)
        client = vad_client(pipeline, silero, interrupt_response=False)
        await said(client)
        client.session.echo.enabled = False
        await client.send({"type": "response.create"})
        while not pipeline.requests:
            await asyncio.sleep(0.001)
        await speak(client, spoken)
        assert client.of("response.done") == [] and pipeline.aborts == []
        assert len(pipeline.submitted) == 1  # still answering: the new turn waits for the next response
        await client.session.close()

    run(scenario)


def test_clearing_the_buffer_resets_the_turn_detection(spoken: bytes, silero: Any) -> None:
    async def scenario() -> None:
        client = vad_client(ScriptedPipeline(topology=CHAT_ONLY), silero)
        half = len(spoken) // 4 // 2 * 2
        await speak(client, spoken[:half])
        assert client.types() == ["input_audio_buffer.speech_started"]
        turns = client.session._turns
        await client.send({"type": "input_audio_buffer.clear"})
        assert client.session._turns is not turns and client.session.buffer == bytearray()
        assert client.types()[-1] == "input_audio_buffer.cleared"

    run(scenario)


def test_an_item_cannot_take_the_id_speech_started_announced(spoken: bytes, silero: Any) -> None:
    # Accepted before: the VAD's commit then added the turn under the same id (two items of one
    # id; delete removed one and retrieve still found the other).
    async def scenario() -> None:
        client = vad_client(ScriptedPipeline(topology=CHAT_ONLY), silero, create_response=False)
        half = len(spoken) // 4 // 2 * 2
        await speak(client, spoken[:half])
        [started] = client.of("input_audio_buffer.speech_started")
        taken = started["item_id"]
        text = {"id": taken, "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        error = await client.refused({"type": "conversation.item.create", "event_id": "c1", "item": text})
        assert (error.param, error.code, error.event_id) == ("item.id", "invalid_value", "c1")
        assert error.message.startswith(f"item.id {taken!r} is taken: the session announced it"), error.message
        await speak(client, spoken[half:])
        await client.settle()
        assert [turn.id for turn in client.session.conversation.turns] == [taken]  # the spoken turn, once
        error = await client.refused({"type": "conversation.item.create", "item": text})
        assert error.message == f"item.id {taken!r} is already in the conversation"

    run(scenario)


# --- where the answer's audio goes, and what a cancelled answer keeps ---------------------


class Track:
    """A transport that plays the answer itself (WebRTC's outbound track): one unit's double."""

    def __init__(self) -> None:
        self.played: list[tuple[str, int]] = []
        self.finished: list[str] = []
        self.cleared = 0
        self.playing = False

    def play(self, response_id: str, pcm: bytes) -> None:
        self.played.append((response_id, len(pcm)))
        self.playing = True

    def finish(self, response_id: str) -> None:
        self.finished.append(response_id)

    def clear(self) -> bool:
        self.cleared += 1
        was, self.playing = self.playing, False
        return was


def track_client(pipeline: ScriptedPipeline, track: Track) -> Client:
    client = Client(pipeline)
    client.session = RealtimeSession(client.state, pipeline, lambda e: client.sent.append(json.loads(ev.encode(e))),
                                     "m", silero=lambda: None, transport="webrtc", audio_out=track)  # type: ignore[arg-type,return-value]
    client.session.settings.vad = None
    client.session._reset_vad()
    return client


def test_a_transport_that_plays_the_audio_gets_it_instead_of_delta_events() -> None:
    async def scenario() -> None:
        track = Track()
        client = track_client(ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer), track)
        assert client.session.echo.enabled is False  # a browser's WebRTC cancels its own echo
        assert client.session.session_object().transport == "webrtc"
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        run_id = client.of("response.done")[0]["response"]["id"]
        assert client.of("response.output_audio.delta") == []
        assert track.played == [(run_id, int(0.05 * RATE) * 2)] * 2 and track.finished == [run_id]
        assert len(client.of("response.output_audio_transcript.delta")) == 2
        await client.send({"type": "output_audio_buffer.clear"})  # still playing what it holds
        assert track.cleared == 1
        error = await client.refused({"type": "output_audio_buffer.clear"})
        assert error.message == "output_audio_buffer.clear: no audio is playing"

    run(scenario)


def test_clearing_a_tracks_audio_cancels_the_response_still_running() -> None:
    async def scenario() -> None:
        track = Track()
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer, hold=True)
        client = track_client(pipeline, track)
        await said(client)
        await client.send({"type": "response.create"})
        while not track.played:
            await asyncio.sleep(0.001)
        await client.send({"type": "output_audio_buffer.clear"})
        assert client.of("response.done")[0]["response"]["status"] == "cancelled"
        assert pipeline.aborts == list(pipeline.requests) and track.cleared >= 1

    run(scenario)


def test_clearing_a_track_before_the_answer_has_audio_cancels_it_and_says_cleared_not_an_error() -> None:
    async def scenario() -> None:
        track = Track()
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: [], hold=True)
        client = track_client(pipeline, track)
        await said(client)
        await client.send({"type": "response.create"})
        await eventually(lambda: client.of("response.created"), "the response under way")
        await client.send({"type": "output_audio_buffer.clear", "event_id": "c1"})
        [done] = client.of("response.done")
        assert done["response"]["status"] == "cancelled" and not track.played
        assert client.of("error") == []  # it did something: the answer that would have played is cancelled
        assert [e["response_id"] for e in client.of("output_audio_buffer.cleared")] == [done["response"]["id"]]
        error = await client.refused({"type": "output_audio_buffer.clear", "event_id": "c2"})  # now nothing is
        assert (error.message, error.event_id) == ("output_audio_buffer.clear: no audio is playing", "c2")

    run(scenario)


def test_a_cancelled_spoken_answer_keeps_the_words_of_the_audio_sent() -> None:
    def half(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        return [RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(tone(0.05), 16_000, transcript="Hello"))]

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=half, hold=True)
        client = Client(pipeline)
        await said(client)
        await client.send({"type": "response.create"})
        while not client.of("response.output_audio.delta"):
            await asyncio.sleep(0.001)
        await client.send({"type": "response.cancel"})
        [done] = client.of("response.done")
        item = done["response"]["output"][0]
        assert item["status"] == "incomplete" and item["content"][0]["transcript"] == "Hello"
        assert client.of("response.output_audio_transcript.done")[0]["transcript"] == "Hello"
        answer = client.session.conversation.turns[-1]
        assert answer.text == "Hello" and answer.incomplete

    run(scenario)


def test_a_spoken_answer_without_text_is_remembered_by_its_words() -> None:
    def audio_only(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        return [RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(tone(0.05), 16_000, transcript="one")),
                RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(tone(0.05), 16_000, transcript="two"))]

    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY, script=audio_only))
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        assert client.session.conversation.turns[-1].text == "one two"
        assert [s.words for s in client.session.conversation.turns[-1].segments] == ["one", "two"]
        assert [s.end_ms for s in client.session.conversation.turns[-1].segments] == [50, 100]

    run(scenario)


def test_a_response_that_would_make_a_stream_underrun_is_refused() -> None:
    from tests.serving.scripted import behind_stream

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer)
        client = Client(pipeline)
        client.state.max_underrun_ms = 100.0
        behind_stream(client.state)
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        [error] = client.of("error")
        assert error["error"]["code"] == "audio_underrun" and "(retry after 4 s)" in error["error"]["message"]
        assert client.of("response.done")[0]["response"]["status"] == "failed" and pipeline.submitted == []
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        await client.settle()
        assert len(pipeline.submitted) == 1  # text has no playback to keep up with

    run(scenario)


# --- the echo guard: speech heard while the answer plays ----------------------------------


def _speaking(audio: np.ndarray) -> Callable[[Any, list[str]], list[Any]]:
    """A script that streams ``audio`` (24 kHz float) as the answer's voice, and holds."""
    from omnictl.coordinator.request import RequestEvent, RequestEventKind
    from omnictl.outputs import AudioChunk

    return lambda inputs, modalities: [RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(audio, RATE))]


async def _answer_playing(client: Client, pipeline: ScriptedPipeline) -> None:
    await said(client)
    await client.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
    while not client.of("response.output_audio.delta"):
        await asyncio.sleep(0.001)
    assert client.session.echo.playing()


def test_the_answer_s_own_voice_coming_back_is_echo_and_neither_interrupts_nor_is_kept(
    spoken: bytes, silero: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnictl.serving.realtime")
    voice = np.frombuffer(spoken, "<i2").astype(np.float32) / 32768.0

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=EVERY_ENDPOINT, script=_speaking(voice), hold=True)
        client = vad_client(pipeline, silero)
        await _answer_playing(client, pipeline)
        await speak(client, spoken)  # the client's speaker, heard by its microphone
        assert "input_audio_buffer.speech_started" not in client.types()
        assert "input_audio_buffer.committed" not in client.types()
        assert client.of("response.done") == [] and pipeline.aborts == []  # the answer goes on
        assert client.session.echo.judged and client.session.echo.judged[-1] >= 0.5
        await client.session.close()

    run(scenario)
    dropped = [r.getMessage() for r in caplog.records if "is the answer's echo" in r.getMessage()]
    assert len(dropped) >= 1 and dropped[0].startswith("realtime session ") and dropped[0].endswith(": dropped")


def test_another_voice_over_the_answer_barges_in_once_judged(
    spoken: bytes, silero: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnictl.serving.realtime")

    async def scenario() -> None:
        hum = tone(3.0, RATE)  # the answer's voice: nothing like the user's
        pipeline = ScriptedPipeline(topology=EVERY_ENDPOINT, script=_speaking(hum), hold=True)
        client = vad_client(pipeline, silero, create_response=False)  # the next turn is not answered
        await _answer_playing(client, pipeline)
        await speak(client, spoken)
        [started] = client.of("input_audio_buffer.speech_started")
        assert started["audio_start_ms"] >= 500  # when the voice began, not when it was judged
        [done] = client.of("response.done")
        assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == (
            "cancelled",
            "turn_detected",
        )
        answer = next(iter(pipeline.requests))  # (the next request is the new turn's transcription)
        assert pipeline.aborts == [answer]
        assert client.session.echo.judged and client.session.echo.judged[0] < 0.5
        await client.session.close()

    run(scenario)
    judged = [r.getMessage() for r in caplog.records if "over the answer is not its echo" in r.getMessage()]
    assert len(judged) == 1


# --- what each response event carries -----------------------------------------------------


@pytest.mark.parametrize(
    ("modalities", "script", "part"),
    [
        (["audio"], spoken_answer, {"type": "output_audio", "transcript": "Hello there."}),
        (["text"], lambda inputs, modalities: text_events(["a", "b"]), {"type": "output_text", "text": "a b"}),
    ],
)
def test_every_response_event_names_its_response_item_and_part(modalities: list[str], script: Any,
                                                               part: dict[str, Any]) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY, script=script))
        await said(client)
        await client.send({"type": "response.create", "response": {"output_modalities": modalities}})
        await client.settle()
        [created] = client.of("response.created")
        response_id = created["response"]["id"]
        assert created["response"]["status"] == "in_progress"
        [part_added] = client.of("response.content_part.added")
        empty = {"type": part["type"], "transcript" if part["type"] == "output_audio" else "text": ""}
        assert {k: v for k, v in part_added["part"].items() if v is not None} == empty
        [added] = client.of("response.output_item.added")
        item_id = added["item"]["id"]
        assert added["item"]["role"] == "assistant" and added["item"]["status"] == "in_progress"
        for event in client.sent:
            if event["type"].startswith("response.") and event["type"] not in ("response.created", "response.done"):
                assert event["response_id"] == response_id, event
                if "item_id" in event:
                    assert event["item_id"] == item_id, event
        [part_done] = client.of("response.content_part.done")
        assert {k: v for k, v in part_done["part"].items() if v is not None} == part
        [item_done] = client.of("response.output_item.done")
        [conversation_done] = client.of("conversation.item.done")
        for item in (item_done["item"], conversation_done["item"]):
            assert item["id"] == item_id and item["status"] == "completed" and item["role"] == "assistant"
            assert {k: v for k, v in item["content"][0].items() if v is not None} == part
        [done] = client.of("response.done")
        assert done["response"]["id"] == response_id and done["response"]["status"] == "completed"
        assert done["response"]["output"][0]["id"] == item_id
        # the conversation remembers the answer as the client saw it
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        [retrieved] = client.of("conversation.item.retrieved")
        assert {k: v for k, v in retrieved["item"]["content"][0].items() if v is not None} == part

    run(scenario)


def test_a_failed_response_says_so_in_its_done_with_the_stage_s_words() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY,
                                         script=lambda inputs, modalities: [error_event("llm crashed", stage="answer")]))
        await said(client)
        await client.send({"type": "response.create"})
        await client.settle()
        [done] = client.of("response.done")
        assert done["response"]["status"] == "failed"
        details = done["response"]["status_details"]
        assert details == {"type": "failed", "error": {"type": "server_error", "code": "stage_failed",
                                                       "message": "stage 'answer': llm crashed"}}

    run(scenario)


def test_items_are_shown_by_role_with_their_content_types() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        for role, content in (("system", {"type": "input_text", "text": "be brief"}),
                              ("user", {"type": "input_text", "text": "hi"}),
                              ("assistant", {"type": "output_text", "text": "hello"}),
                              ("assistant", {"type": "output_audio", "transcript": "spoken"})):
            await client.send({"type": "conversation.item.create", "item": {"role": role, "content": [content]}})
        added = [e["item"] for e in client.of("conversation.item.added")]
        shown = [(i["role"], {k: v for k, v in i["content"][0].items() if v is not None}, i["status"]) for i in added]
        assert shown == [
            ("system", {"type": "input_text", "text": "be brief"}, "completed"),
            ("user", {"type": "input_text", "text": "hi"}, "completed"),
            ("assistant", {"type": "output_text", "text": "hello"}, "completed"),
            ("assistant", {"type": "output_audio", "transcript": "spoken"}, "completed"),
        ]
        previous = [e["previous_item_id"] for e in client.of("conversation.item.added")]
        assert previous == [None, added[0]["id"], added[1]["id"], added[2]["id"]]

    run(scenario)


# --- every refusal, whole ------------------------------------------------------------------

_AUDIO_ANSWER = {"type": "conversation.item.create",
                 "item": {"id": "a1", "role": "assistant", "content": [{"type": "output_audio", "transcript": "x"}]}}
_TRUNCATE = {"type": "conversation.item.truncate", "event_id": "E", "content_index": 0, "audio_end_ms": 0}


@pytest.mark.parametrize(
    ("before", "event", "refused"),
    [
        ([], {"type": "session.update", "event_id": "E", "session": {"type": "dance"}},
         ("session.type 'dance' is not supported; this server runs 'realtime' and 'transcription' sessions",
          "unsupported_session_type", "session.type")),
        ([], {"type": "session.update", "event_id": "E", "session": {"type": "transcription"}},
         ("session.type 'transcription': topology 'fast' has no terminal of modality 'transcript' (nothing here "
          "recognises speech)", "unsupported_session_type", "session.type")),
        ([], {"type": "session.update", "event_id": "E", "session": {
            "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}},
         ("session.audio.input.transcription: topology 'fast' has no terminal of modality 'transcript'; send null",
          "invalid_value", "session.audio.input.transcription")),
        ([], {"type": "session.update", "event_id": "E", "session": {
            "type": "realtime", "audio": {"output": {"format": {"type": "audio/flac"}}}}},
         ("session.audio.output.format.type 'audio/flac' is not an audio format this server takes (audio/pcm, "
          "audio/pcmu, audio/pcma)", "unsupported_audio_format", "session.audio.output.format.type")),
        ([], {"type": "session.update", "event_id": "E", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
         ("session.audio.input.format.rate: audio/pcm is 24000 Hz here, got 16000", "unsupported_audio_format",
          "session.audio.input.format.rate")),
        ([], {"type": "input_audio_buffer.append", "event_id": "E", "audio": "@@@@"},
         ("input_audio_buffer.append: 'audio' is not valid base64 (Only base64 data is allowed)", "invalid_base64",
          "audio")),
        ([], {"type": "input_audio_buffer.append", "event_id": "E", "audio": base64.b64encode(b"\x01\x02\x03").decode()},
         ("input_audio_buffer.append: pcm16 audio must hold whole 16-bit samples, got 3 bytes", "invalid_audio",
          "audio")),
        ([], {"type": "input_audio_buffer.append", "event_id": "E", "audio": base64.b64encode(bytes(3002)).decode()},
         ("the input audio buffer is limited to 3000 bytes (0 s of audio); commit or clear it",
          "input_audio_buffer_too_large", "audio")),
        ([{"type": "conversation.item.create", "item": {"id": "u1", "role": "user", "content": [
            {"type": "input_text", "text": "x"}]}}], {**_TRUNCATE, "item_id": "u1"},
         ("conversation.item.truncate: item u1 is not an assistant audio message; only those can be truncated",
          "invalid_value", "item_id")),
        ([{"type": "conversation.item.create", "item": {"id": "a1", "role": "assistant", "content": [
            {"type": "output_text", "text": "x"}]}}], {**_TRUNCATE, "item_id": "a1"},
         ("conversation.item.truncate: item a1 is not an assistant audio message; only those can be truncated",
          "invalid_value", "item_id")),
        ([_AUDIO_ANSWER], {**_TRUNCATE, "item_id": "a1", "content_index": 1},
         ("conversation.item.truncate: content_index must be 0 (an item has one part), got 1", "invalid_value",
          "content_index")),
        ([_AUDIO_ANSWER], {**_TRUNCATE, "item_id": "a1", "audio_end_ms": 5},
         ("conversation.item.truncate: audio_end_ms 5 is outside the item's audio (0 to 0 ms)", "invalid_value",
          "audio_end_ms")),
        ([{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(0.05)).decode()}],
         {"type": "input_audio_buffer.commit", "event_id": "E"},
         ("input_audio_buffer.commit: the buffer holds 50 ms of audio; at least 100 ms is needed",
          "input_audio_buffer_commit_empty", None)),
        ([], {"type": "response.cancel", "event_id": "E"},
         ("there is no response in progress to cancel", "response_cancel_not_active", None)),
    ],
)
def test_each_refusal_says_what_which_field_and_which_event(before: list[dict[str, Any]], event: dict[str, Any],
                                                            refused: tuple[str, str, str | None]) -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY), Limits(max_realtime_buffer_bytes=3000))
        for earlier in before:
            await client.send(earlier)
        sent = len(client.sent)
        error = await client.refused(event)
        assert (error.message, error.code, error.param, error.event_id) == (*refused, "E")
        assert len(client.sent) == sent  # nothing else was said for it

    run(scenario)


def test_a_truncation_may_end_a_millisecond_past_the_audio_and_stops_the_answer_playing_it() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY))
        await client.send(_AUDIO_ANSWER)
        await client.send({**_TRUNCATE, "item_id": "a1", "audio_end_ms": 1})  # rounding: one past is taken
        [truncated] = client.of("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == ("a1", 1)

    run(scenario)


def test_the_session_type_cannot_change_during_a_response() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=EVERY_ENDPOINT, script=lambda inputs, modalities: text_events(["a"])[:1],
                                    hold=True)
        client = Client(pipeline)
        await said(client)
        await client.send({"type": "response.create"})
        while client.session.response is None or not pipeline.requests:
            await asyncio.sleep(0.001)
        response_id = client.of("response.created")[0]["response"]["id"]
        error = await client.refused({"type": "session.update", "event_id": "E", "session": {"type": "transcription"}})
        assert (error.message, error.code, error.param, error.event_id) == (
            f"session.type cannot change while response {response_id} is in progress", "invalid_value",
            "session.type", "E")
        await client.session.close()

    run(scenario)


# --- fields the protocol has that this server cannot honour: refused, never ignored ----------

_NEAR = {"type": "near_field"}


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "session.update", "session": {"include": ["item.input_audio_transcription.logprobs"]}},
         "invalid_value", "session.include"),
        ({"type": "session.update", "session": {"tracing": {"workflow_name": "w"}}}, "invalid_value",
         "session.tracing"),
        ({"type": "session.update", "session": {"truncation": "disabled"}}, "invalid_value", "session.truncation"),
        ({"type": "session.update", "session": {"truncation": {"type": "retention_ratio", "retention_ratio": 0.8}}},
         "invalid_value", "session.truncation"),
        ({"type": "session.update", "session": {"prompt": {"id": "pmpt_1"}}}, "invalid_value", "session.prompt"),
        ({"type": "session.update", "session": {"reasoning": {"effort": "low"}}}, "invalid_value", "session.reasoning"),
        ({"type": "session.update", "session": {"model": "gpt-realtime"}}, "model_not_found", "session.model"),
        ({"type": "session.update", "session": {"audio": {"input": {"noise_reduction": _NEAR}}}}, "invalid_value",
         "session.audio.input.noise_reduction"),
        ({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 5000}}}}}, "invalid_value",
         "session.audio.input.turn_detection.idle_timeout_ms"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {
            "model": "whisper-1", "language": "French!"}}}}}, "invalid_value",
         "session.audio.input.transcription.language"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": 7}}}}},
         "invalid_value", "session.audio.input.transcription.language"),
        # well-formed codes the recognizer does not know (taken before: every turn then failed)
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": "zz"}}}}},
         "invalid_value", "session.audio.input.transcription.language"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": "auto"}}}}},
         "invalid_value", "session.audio.input.transcription.language"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"prompt": "omnictl, ZeroMQ"}}}}},
         "invalid_value", "session.audio.input.transcription.prompt"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"keywords": ["omnictl"]}}}}},
         "invalid_value", "session.audio.input.transcription.keywords"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"langauge": "fr"}}}}},
         "invalid_value", "session.audio.input.transcription.langauge"),
        # the same for a transcription session's update
        ({"type": "session.update", "session": {"type": "transcription", "include": ["item.input_audio_transcription"
                                                                                     ".logprobs"]}},
         "invalid_value", "session.include"),
        # a refused field changes none of the others, whichever was checked first (modalities and the
        # voice were once applied before a later field was refused)
        ({"type": "session.update", "session": {"output_modalities": ["text"], "instructions": "x",
                                                "audio": {"input": {"noise_reduction": _NEAR}}}},
         "invalid_value", "session.audio.input.noise_reduction"),
        ({"type": "session.update", "session": {"max_output_tokens": 0, "audio": {"output": {"voice": "amy"}}}},
         "invalid_value", "session.max_output_tokens"),
        ({"type": "response.create", "response": {"conversation": "none"}}, "invalid_value", "response.conversation"),
        ({"type": "response.create", "response": {"input": []}}, "invalid_value", "response.input"),
        ({"type": "response.create", "response": {"prompt": {"id": "pmpt_1"}}}, "invalid_value", "response.prompt"),
        ({"type": "response.create", "response": {"reasoning": {"effort": "low"}}}, "invalid_value",
         "response.reasoning"),
        ({"type": "response.create", "response": {"audio": {"output": {"voice": "../x"}}}}, "invalid_value",
         "response.audio.output.voice"),
        ({"type": "response.create", "response": {"audio": {"output": {"format": {"type": "audio/flac"}}}}},
         "unsupported_audio_format", "response.audio.output.format.type"),
        ({"type": "response.create", "response": {"metadata": {"k" * 65: "v"}}}, "invalid_value", "response.metadata"),
        ({"type": "conversation.item.create", "previous_item_id": "nope", "item": {
            "role": "user", "content": [{"type": "input_text", "text": "x"}]}}, "item_not_found", "previous_item_id"),
        ({"type": "conversation.item.create", "item": {"role": "assistant", "content": [
            {"type": "output_audio", "transcript": "x", "audio": base64.b64encode(pcm16(0.1)).decode()}]}},
         "invalid_value", "item.content[0].audio"),
        ({"type": "conversation.item.create", "item": {"role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(pcm16(0.1)).decode(), "transcript": "hi"}]}},
         "invalid_value", "item.content[0].transcript"),
        ({"type": "conversation.item.create", "item": {"role": "user", "content": [
            {"type": "input_text", "text": "x", "audio": base64.b64encode(pcm16(0.1)).decode()}]}},
         "invalid_value", "item.content[0].audio"),
        # the beta protocol's names, once dropped unread: refused naming the GA field
        ({"type": "session.update", "session": {"voice": "amy"}}, "invalid_value", "session.voice"),
        ({"type": "session.update", "session": {"turn_detection": None}}, "invalid_value", "session.turn_detection"),
        ({"type": "session.update", "session": {"input_audio_transcription": {"model": "whisper-1"}}},
         "invalid_value", "session.input_audio_transcription"),
        ({"type": "response.create", "response": {"modalities": ["text"]}}, "invalid_value", "response.modalities"),
        # already refused when decoded: no stage makes or takes tool calls
        ({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c",
                                                       "output": "{}"}}, "invalid_value", "item.type"),
    ],
)
def test_a_field_the_server_cannot_honour_is_refused_by_name_and_changes_nothing(
        event: dict[str, Any], code: str, param: str) -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline()
        client = Client(pipeline)
        await client.send({"type": "conversation.item.create", "item": {
            "id": "u0", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        client.sent.clear()
        before = client.session.session_object()
        with pytest.raises(ev.EventError) as caught:
            await client.send({**event, "event_id": "E"})  # decoded or handled: refused either way
        error = caught.value
        assert (error.code, error.param, error.event_id) == (code, param, "E"), error.message
        assert param.rsplit(".", 1)[-1].split("[")[0] in error.message  # the message names the field too
        assert client.session.session_object() == before and client.sent == []
        assert [t.id for t in client.session.conversation.turns] == ["u0"]
        assert client.session.response is None and pipeline.submitted == []

    run(scenario)


def test_values_that_ask_for_nothing_pass_and_session_updated_says_what_is_done() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline())
        await client.send({"type": "session.update", "session": {
            "type": "realtime", "model": "m", "include": [], "tracing": "auto", "truncation": "auto", "prompt": None,
            "reasoning": None, "parallel_tool_calls": True, "tools": [], "tool_choice": "auto",
            "audio": {"input": {"noise_reduction": None,
                                "transcription": {"model": "whisper-1", "language": None, "prompt": ""},
                                "turn_detection": {"type": "server_vad", "idle_timeout_ms": None}}}}})
        [updated] = client.of("session.updated")
        audio_in = updated["session"]["audio"]["input"]
        assert audio_in["noise_reduction"] is None and audio_in["transcription"] == {"model": "hear"}  # the recognizer
        assert audio_in["turn_detection"]["idle_timeout_ms"] is None
        await said(client)
        await client.send({"type": "response.create", "response": {"conversation": "auto", "metadata": None,
                                                                     "parallel_tool_calls": False}})
        await client.settle()
        assert client.of("response.done")[0]["response"]["status"] == "completed"

    run(scenario)


def test_a_response_s_own_voice_and_output_format_are_applied_to_it_alone() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=spoken_answer)
        client = Client(pipeline)
        await said(client)
        await client.send({"type": "response.create", "response": {
            "audio": {"output": {"voice": "amy", "format": {"type": "audio/pcmu"}}}}})
        await client.settle()
        await client.send({"type": "response.create"})
        await client.settle()
        assert [inputs.voice for inputs, *_ in pipeline.submitted] == ["amy", None]  # then the session's (alloy)
        deltas = [base64.b64decode(d["delta"]) for d in client.of("response.output_audio.delta")]
        assert [len(d) for d in deltas] == [int(0.05 * 8000)] * 2 + [int(0.05 * RATE) * 2] * 2  # G.711: a byte a sample
        assert client.session.settings.voice == "alloy" and client.session.settings.output_codec.type == "audio/pcm"

    run(scenario)


def test_a_response_s_metadata_and_token_limit_are_on_its_events() -> None:
    async def scenario() -> None:
        client = Client(ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a"])))
        await said(client)
        await client.send({"type": "session.update", "session": {"max_output_tokens": 9}})
        await client.send({"type": "response.create", "response": {"metadata": {"topic": "weather"},
                                                                     "output_modalities": ["text"]}})
        await client.settle()
        await client.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        await client.settle()
        responses = [e["response"] for e in client.of("response.created") + client.of("response.done")]
        assert [(r["metadata"], r["max_output_tokens"]) for r in responses] == [
            ({"topic": "weather"}, 9), (None, 4), ({"topic": "weather"}, 9), (None, 4)]

    run(scenario)


def test_previous_item_id_places_the_item_and_the_answer_hears_that_order() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: text_events(["a"]))
        client = Client(pipeline)
        for item_id, text, previous in (("u1", "one", None), ("u3", "three", None), ("u2", "two", "u1"),
                                        ("u0", "zero", "root"), ("u4", "four", "u3")):
            event: dict[str, Any] = {"type": "conversation.item.create", "item": {
                "id": item_id, "role": "user", "content": [{"type": "input_text", "text": text}]}}
            if previous is not None:
                event["previous_item_id"] = previous
            await client.send(event)
        assert [t.id for t in client.session.conversation.turns] == ["u0", "u1", "u2", "u3", "u4"]
        added = {e["item"]["id"]: e["previous_item_id"] for e in client.of("conversation.item.added")}
        assert added == {"u1": None, "u3": "u1", "u2": "u1", "u0": None, "u4": "u3"}
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        await client.settle()
        [(inputs, *_)] = pipeline.submitted
        assert [m.parts[0].text for m in inputs.messages] == ["zero", "one", "two", "three", "four"]

    run(scenario)
