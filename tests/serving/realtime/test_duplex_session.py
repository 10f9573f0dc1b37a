"""The full-duplex session (serving/realtime/duplex.py) in this process, against a stand-in for
the session-long request: the protocol's events, their order and fields, the refusals by name,
cancel and failure, and the WebRTC track's side. The real Moshi topology behind a real server
is tests/serving/realtime/test_duplex.py's (slow); these reach every branch in under a second."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, AsyncIterator

import numpy as np
import pytest

from omnictl.audio.pcm import float_to_pcm16_bytes
from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import AudioChunk, TextDelta
from omnictl.serving.realtime.duplex import RATE, DuplexSession


class DuplexRequest:
    """One session-long request: each chunk sent comes back as a frame of half its amplitude and
    a word, until the input ends (then its result), or it fails with ``fail`` at the end."""

    def __init__(self, request_id: str, fail: str | None) -> None:
        self.id = request_id
        self.fail = fail
        self.sent: list[AudioChunk] = []
        self._inbox: asyncio.Queue[AudioChunk | None] = asyncio.Queue()

    async def send(self, chunk: AudioChunk) -> None:
        self.sent.append(chunk)
        await self._inbox.put(chunk)

    async def end_input(self) -> None:
        await self._inbox.put(None)

    async def events(self) -> AsyncIterator[RequestEvent]:
        n = 0
        while (chunk := await self._inbox.get()) is not None:
            yield RequestEvent(RequestEventKind.STREAM, "mimi_decoder", AudioChunk(chunk.samples * 0.5, RATE))
            yield RequestEvent(RequestEventKind.STREAM, "text", TextDelta(f"w{n} "))
            yield RequestEvent(RequestEventKind.STREAM, "text", TextDelta(""))  # nothing to say: no event
            n += 1
        if self.fail is not None:
            raise RuntimeError(self.fail)

    async def result(self) -> dict[str, Any]:
        return {}


class DuplexPipe:
    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.requests: list[DuplexRequest] = []
        self.submitted: list[tuple[Any, bool]] = []
        self.aborts: list[str] = []

    async def submit(self, inputs: Any, input_stream: bool = False) -> DuplexRequest:
        self.submitted.append((inputs, input_stream))
        self.requests.append(DuplexRequest(f"req-{len(self.requests)}", self.fail))
        return self.requests[-1]

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)


class Track:
    """The WebRTC call's outbound track, as the session uses it."""

    def __init__(self) -> None:
        self.played: list[tuple[str, bytes]] = []
        self.finished: list[str] = []
        self.cleared = 0

    def play(self, response_id: str, pcm: bytes) -> None:
        self.played.append((response_id, pcm))

    def finish(self, response_id: str) -> None:
        self.finished.append(response_id)

    def clear(self) -> None:
        self.cleared += 1


def samples(n: int, value: float = 0.25) -> np.ndarray:
    return np.full(n, value, dtype=np.float32)


def append(pcm: np.ndarray) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(float_to_pcm16_bytes(pcm)).decode()})


def session(pipe: DuplexPipe, track: Track | None = None) -> tuple[DuplexSession, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    return DuplexSession(pipe, sent.append, "moshi", audio_out=track), sent


async def settled(sent: list[dict[str, Any]], kind: str, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not any(e["type"] == kind for e in sent):
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), timeout)


def types(sent: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in sent]


def test_a_session_streams_each_frame_and_word_and_ends_when_the_input_does() -> None:
    async def scenario() -> None:
        pipe = DuplexPipe()
        s, sent = session(pipe)
        assert s.session_object()["mode"] == "full_duplex"
        assert s.session_object()["audio"]["input"] == {"format": {"type": "audio/pcm", "rate": RATE},
                                                        "turn_detection": None}
        await s.handle(append(samples(1920)))
        await s.handle(append(samples(1920, 0.5)))
        assert pipe.submitted == [({"sampling": {}}, True)]  # one session-long request, streamed
        request = pipe.requests[0]
        assert [c.sample_rate for c in request.sent] == [RATE, RATE]
        assert np.allclose(request.sent[1].samples, 0.5, atol=1e-4)
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))
        await settled(sent, "response.done")
        assert types(sent) == [
            "response.created", "response.output_item.added", "response.content_part.added",
            "response.output_audio.delta", "response.output_audio_transcript.delta",
            "response.output_audio.delta", "response.output_audio_transcript.delta",
            "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
            "response.output_item.done", "response.done",
        ]
        response_id = sent[0]["response"]["id"]
        assert sent[0]["response"]["status"] == "in_progress"
        deltas = [e for e in sent if e["type"] == "response.output_audio.delta"]
        assert all(e["response_id"] == response_id for e in deltas)
        assert base64.b64decode(deltas[1]["delta"]) == float_to_pcm16_bytes(samples(1920, 0.25))  # half of 0.5
        transcript = next(e for e in sent if e["type"] == "response.output_audio_transcript.done")["transcript"]
        assert transcript == "w0 w1 "
        assert sent[-3]["part"] == {"type": "output_audio", "transcript": "w0 w1 "}
        assert sent[-1]["response"]["status"] == "completed" and s.current is None
        assert pipe.aborts == []
        # a later append opens a new response
        await s.handle(append(samples(960)))
        assert len(pipe.requests) == 2 and s.current is not None
        await s.cancel("client_cancelled")

    asyncio.run(scenario())


@pytest.mark.parametrize(("event", "code", "param"), [
    ("not json", "invalid_json", None),
    ([1, 2], "invalid_event", "type"),
    ({"type": "no.such.event"}, "invalid_event", "type"),
    ({"type": "input_audio_buffer.append", "audio": 7}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_empty", None),
    ({"type": "response.create"}, "unsupported_in_full_duplex", None),
    ({"type": "input_audio_buffer.clear"}, "unsupported_in_full_duplex", None),
    ({"type": "conversation.item.create", "item": {}}, "unsupported_in_full_duplex", None),
    ({"type": "output_audio_buffer.clear"}, "unsupported_in_full_duplex", None),
    ({"type": "session.update", "session": 3}, "invalid_value", "session"),
    ({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}},
     "unsupported_in_full_duplex", "session.audio.input.turn_detection"),
    ({"type": "session.update", "session": {"instructions": "be brief"}}, "unsupported_in_full_duplex",
     "session.instructions"),
    ({"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}}},
     "invalid_value", "session.audio.output.format"),
    ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
     "invalid_value", "session.audio.input.format"),
    ({"type": "session.update", "session": {"output_modalities": ["text"]}}, "invalid_value",
     "session.output_modalities"),
])
def test_an_event_a_duplex_session_cannot_take_is_refused_by_name_and_the_session_goes_on(
        event: Any, code: str, param: str | None) -> None:
    async def scenario() -> None:
        pipe = DuplexPipe()
        s, sent = session(pipe)
        raw = event if isinstance(event, str) else json.dumps(event if isinstance(event, list) else
                                                               {**event, "event_id": "ev_1"})
        await s.handle(raw)
        assert types(sent) == ["error"], sent
        error = sent[0]["error"]
        assert (error["code"], error["param"]) == (code, param), error
        if isinstance(event, dict):
            assert error["event_id"] == "ev_1"
        assert pipe.submitted == [] and s.current is None
        await s.handle(json.dumps({"type": "session.update", "session": {"output_modalities": ["audio"]}}))
        assert sent[-1]["type"] == "session.updated" and sent[-1]["session"]["mode"] == "full_duplex"

    asyncio.run(scenario())


def test_an_append_after_the_input_ended_is_refused_until_the_response_is_done() -> None:
    async def scenario() -> None:
        pipe = DuplexPipe()
        s, sent = session(pipe)
        await s.handle(append(samples(960)))
        response = s.current
        assert response is not None
        response.input_ended = True  # the commit is on its way to the pipeline, its end not yet out
        await s.handle(append(samples(960)))
        assert sent[-1]["type"] == "error" and sent[-1]["error"]["code"] == "input_ended"
        assert len(pipe.requests[0].sent) == 1
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))  # ended already: not twice
        await pipe.requests[0].end_input()
        await settled(sent, "response.done")

    asyncio.run(scenario())


def test_cancel_ends_the_response_as_cancelled_and_aborts_its_request() -> None:
    async def scenario() -> None:
        pipe = DuplexPipe()
        s, sent = session(pipe)
        await s.handle(append(samples(960)))
        await settled(sent, "response.output_audio.delta")
        await s.handle(json.dumps({"type": "response.cancel"}))
        assert sent[-1]["type"] == "response.done"
        assert sent[-1]["response"]["status"] == "cancelled"
        assert sent[-1]["response"]["status_details"]["reason"] == "client_cancelled"
        assert pipe.aborts == [pipe.requests[0].id] and s.current is None
        item = next(e for e in sent if e["type"] == "response.output_item.done")["item"]
        assert item["status"] == "incomplete"
        await s.close()  # nothing left to end
        assert pipe.aborts == [pipe.requests[0].id]

    asyncio.run(scenario())


def test_a_cancel_right_after_the_first_append_still_ends_the_response_once() -> None:
    # Its pump task is cancelled before it ever ran: the closing events come from cancel.
    async def scenario() -> None:
        pipe = DuplexPipe()
        s, sent = session(pipe)
        await s.handle(append(samples(960)))
        await s.close()
        assert types(sent) == [
            "response.created", "response.output_item.added", "response.content_part.added",
            "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
            "response.output_item.done", "response.done",
        ]
        assert sent[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_gone"}
        assert pipe.aborts == [pipe.requests[0].id]

    asyncio.run(scenario())


def test_a_failed_request_is_an_error_event_and_a_failed_response_and_the_session_goes_on() -> None:
    async def scenario() -> None:
        pipe = DuplexPipe(fail="stage 'temporal' failed: out of memory")
        s, sent = session(pipe)
        await s.handle(append(samples(960)))
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))
        await settled(sent, "response.done")
        error = next(e for e in sent if e["type"] == "error")["error"]
        assert error["code"] == "response_failed" and "out of memory" in error["message"]
        done = sent[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["reason"] == "RuntimeError"
        await s.handle(append(samples(960)))  # a new response
        assert len(pipe.requests) == 2
        await s.cancel("client_gone")

    asyncio.run(scenario())


def test_over_a_call_the_audio_goes_on_the_track_and_the_microphone_pauses_after_a_commit() -> None:
    async def scenario() -> None:
        pipe, track = DuplexPipe(), Track()
        s, sent = session(pipe, track)
        pcm = float_to_pcm16_bytes(samples(960))
        await s.feed(pcm)
        await s.feed(pcm)
        await settled(sent, "response.output_audio_transcript.delta")
        response_id = sent[0]["response"]["id"]
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))
        await s.feed(pcm)  # the microphone goes on: dropped until response.done
        await settled(sent, "response.done")
        assert len(pipe.requests[0].sent) == 2
        assert "response.output_audio.delta" not in types(sent)  # on the track instead
        assert [r for r, _ in track.played] == [response_id, response_id]
        assert track.played[0][1] == float_to_pcm16_bytes(samples(960, 0.125))
        assert track.finished == [response_id] and track.cleared == 0
        s.playout_finished(response_id)
        await s.feed(pcm)  # the next response
        assert len(pipe.requests) == 2
        await s.close()
        assert track.cleared == 1 and pipe.aborts == [pipe.requests[1].id]

    asyncio.run(scenario())
