"""An answer with nothing to pronounce (a clause of "..." or an emoji: the TTS gives 0 samples)
through the routes, against a scripted pipeline: a chat completion's WAV is still a WAV (a
header, no samples), and a realtime answer goes on past the empty clause. Each is
milliseconds; the units that failed are pinned next to them (``tests/audio/test_resample.py``,
``tests/serving/realtime/test_echo_guard.py``, ``tests/serving/speech/test_audio.py``)."""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.serving.app import create_app
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline, text_events, tone

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
PIPER_RATE = 22_050  # the voice assistant's TTS speaks at this rate
NOTHING = np.zeros(0, np.float32)


def serve(pipeline: ScriptedPipeline) -> TestClient:
    return TestClient(create_app(ServingState(model_name="m", pipeline=pipeline, api_key=KEY)),
                      base_url="http://localhost")


def silent_answer(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
    """The TTS's answer to a reply of "...": no samples, streamed and whole."""
    return [RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(NOTHING, PIPER_RATE, "...")),
            RequestEvent(RequestEventKind.RESULT, "speak", AudioResult(NOTHING, PIPER_RATE, "..."))]


def wav_frames(data: bytes) -> tuple[int, int]:
    """(sample rate, frames) of a WAV file, as Python's own reader sees it."""
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return wav.getframerate(), wav.getnframes()


def test_a_chat_answer_of_no_samples_is_a_wav_of_no_samples() -> None:
    # Was "data": "" (FFmpeg writes a WAV's header with its first packet, and there was none).
    client = serve(ScriptedPipeline(script=silent_answer))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": "wav"}}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    audio = response.json()["choices"][0]["message"]["audio"]
    data = base64.b64decode(audio["data"])
    assert len(data) == 44 and wav_frames(data) == (PIPER_RATE, 0)
    assert audio["transcript"] == "..."


def test_a_streamed_chat_answer_of_no_samples_joins_to_a_wav_header() -> None:
    client = serve(ScriptedPipeline(script=silent_answer))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": "wav"}, "stream": True}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    chunks = [json.loads(block[len("data: "):]) for block in response.text.split("\n\n")
              if block.startswith("data: {")]
    data = b"".join(base64.b64decode(c["choices"][0]["delta"]["audio"]["data"])
                    for c in chunks if c["choices"] and "audio" in c["choices"][0]["delta"])
    # A streamed WAV marks its sizes unknown (0xFFFFFFFF), as every streamed WAV of this server does.
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data" and len(data) == 44


@pytest.mark.parametrize("clause", ["...", "\N{SMILING FACE WITH SMILING EYES}"])
def test_a_realtime_answer_goes_on_past_a_clause_with_nothing_to_pronounce(clause: str) -> None:
    # Was response.done 'failed' (server_error) and the rest of the answer lost: the echo
    # guard's 24 -> 16 kHz resampler raised on the clause's 0 samples.
    spoken = tone(0.2, PIPER_RATE)

    def script(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        return [RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(NOTHING, PIPER_RATE, clause)),
                RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(spoken, PIPER_RATE, " Then the rest.")),
                *text_events([clause, "Then", "the", "rest."])]

    client = serve(ScriptedPipeline(script=script))
    with client, client.websocket_connect("ws://localhost/v1/realtime", headers=AUTH) as ws:
        assert json.loads(ws.receive_text())["type"] == "session.created"  # server VAD and the echo guard on
        item = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ws.send_text(json.dumps({"type": "conversation.item.create", "item": item}))
        ws.send_text(json.dumps({"type": "response.create", "response": {"output_modalities": ["audio"]}}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.receive_text()))
    done = events[-1]["response"]
    assert done["status"] == "completed", done
    deltas = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
    assert deltas and all(deltas)  # nothing to send for the empty clause; the next clause's audio went out
    assert sum(len(d) for d in deltas) == pytest.approx(0.2 * 24_000 * 2, abs=4)  # pcm16 at 24 kHz
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == f"{clause} Then the rest."
