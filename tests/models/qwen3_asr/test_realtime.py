"""Qwen3-ASR behind ``/v1/realtime`` transcription sessions: topologies/qwen3-asr.yaml (a
``transcript`` terminal alone) served in process on the tiny checkpoint (conftest's server,
shared with test_served.py), a real WebSocket client. Each committed turn is transcribed by
the served topology (deltas as its decoder writes, then the completed transcript), which is
transformers' greedy answer for the committed audio; a conversation session is refused
naming why."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from websockets.sync.client import ClientConnection, connect

from omnictl.audio.pcm import float_to_pcm16_bytes, pcm16_to_float
from omnictl.inputs import PCM16_RATE, AudioPart, decode_audio
from omnictl.models.qwen3_asr.frontend import SAMPLE_RATE
from omnictl.serving.server import Listening
from tests.support.held import held_by

from .conftest import MAX_TOKENS, Reference, clip, on_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a real serve of the tiny model (conftest's, shared)

CHUNK = 4_800  # 200 ms at 24 kHz


def socket(served: Listening, query: str = "") -> ClientConnection:
    return connect(served.url.replace("http", "ws", 1) + "/v1/realtime" + query, open_timeout=30, max_size=None)


def receive(ws: ClientConnection, timeout: float = 120.0) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=timeout)))


def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind`` (an error fails the test)."""
    seen = []
    while True:
        seen.append(receive(ws))
        if seen[-1]["type"] == kind:
            return seen
        assert seen[-1]["type"] != "error", seen[-1]


def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    ws.send(json.dumps(event))


def pcm24k(seed: int, seconds: float) -> bytes:
    """A clip as the client sends it: pcm16 at 24 kHz (the tiny model's clip, resampled up)."""
    return float_to_pcm16_bytes(
        decode_audio(AudioPart(samples=clip(seed, seconds), sample_rate=SAMPLE_RATE), PCM16_RATE)
    )


def heard_by_the_model(pcm: bytes) -> np.ndarray:
    """The committed turn as the recognizer hears it: pcm16 at 24 kHz read, then at 16 kHz."""
    return decode_audio(AudioPart(samples=pcm16_to_float(pcm), sample_rate=PCM16_RATE), SAMPLE_RATE)


def speak(ws: ClientConnection, pcm: bytes) -> None:
    """Append the clip in 200 ms pieces and commit it (turn detection is off: the client commits)."""
    for at in range(0, len(pcm), CHUNK * 2):
        send(ws, {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[at : at + CHUNK * 2]).decode()})
    send(ws, {"type": "input_audio_buffer.commit"})


def test_a_session_opens_as_a_transcription_one_and_each_turn_is_transformers_greedy_transcript(
    served: Listening, reference: Reference
) -> None:
    turns = [pcm24k(1, 1.5), pcm24k(2, 1.0)]
    with socket(served) as ws:  # no ?intent=: a recognizer alone serves transcription sessions
        created = until(ws, "session.created")[-1]
        assert created["session"]["type"] == "transcription", created
        assert created["session"]["audio"]["input"]["transcription"] == {"model": "transcript"}
        send(
            ws,
            {
                "type": "session.update",
                "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}},
            },
        )
        until(ws, "session.updated")
        heard = []
        for pcm in turns:
            speak(ws, pcm)
            committed = until(ws, "input_audio_buffer.committed")[-1]
            events = until(ws, "conversation.item.input_audio_transcription.completed")
            assert all(e["item_id"] == committed["item_id"] for e in events if "transcription" in e["type"])
            deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
            completed = events[-1]
            # streamed as the decoder writes (several deltas), and they add up to the transcript
            assert len(deltas) > 1 and "".join(deltas) == completed["transcript"], deltas
            heard.append((completed["transcript"], completed["usage"]["seconds"]))
        assert [e["type"] for e in until(ws, "conversation.item.done")][-1] == "conversation.item.done"
    for pcm, (transcript, seconds) in zip(turns, heard):
        _, parsed = reference.generate(heard_by_the_model(pcm), max_tokens=MAX_TOKENS)
        assert transcript == parsed["transcription"]
        assert seconds == pytest.approx(len(pcm) / 2 / PCM16_RATE, abs=1e-3)
    assert on_loop(served, held_by(served.pipeline)) == []


def test_a_conversation_is_refused_naming_why(served: Listening) -> None:
    with socket(served, "?intent=realtime") as ws:
        error = receive(ws)
        assert error["type"] == "error" and error["error"]["code"] == "unsupported_session_type", error
        assert "only transcribes" in error["error"]["message"] and "intent=transcription" in error["error"]["message"]
    with socket(served, "?intent=transcription") as ws:
        assert until(ws, "session.created")[-1]["session"]["type"] == "transcription"
        send(ws, {"type": "session.update", "event_id": "u1", "session": {"type": "realtime"}})
        error = receive(ws)
        assert (error["type"], error["error"]["code"], error["error"]["param"]) == (
            "error",
            "unsupported_session_type",
            "session.type",
        ), error
        assert "only transcribes" in error["error"]["message"]
        send(ws, {"type": "response.create", "event_id": "r1"})
        error = receive(ws)
        assert error["type"] == "error" and "only transcribes" in error["error"]["message"], error
