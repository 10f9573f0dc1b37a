"""CSM's HTTP routes: topologies/csm.yaml served in process on the tiny checkpoint (one
``omnictl serve`` for the module, CPU), asked over HTTP for the same greedy request three
ways (``/v1/audio/speech`` as WAV, as server-sent events, and chat completions with audio
out), each answer the very audio the Pipeline API gives for it, at 16 bits (the WAV within
one step of it: its encoder rounds its own way)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from omnictl.audio.pcm import float_to_pcm16
from omnictl.outputs import AudioResult
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening
from tests.serving.harness import serving_in_process
from tests.support.held import held_by

from .conftest import FRAMES, TEXT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a real serve of the tiny model, launched once

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "csm.yaml"
RATE = 24_000  # Mimi's, and the routes' pcm16 rate: no resampling between them


@pytest.fixture(scope="module")
def served(tiny_csm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:
    config = ServeConfig(topology=str(TOPOLOGY), http=HttpConfig(port=0)).launching(
        model_path=str(tiny_csm), device="cpu", run_dir=tmp_path_factory.mktemp("csm-run")
    )
    with serving_in_process(config, "in-process omnictl serve (csm)") as listening:
        yield listening


def on_loop(served: Listening, coroutine: Any, timeout: float = 120.0) -> Any:
    assert served.loop is not None
    return asyncio.run_coroutine_threadsafe(coroutine, served.loop).result(timeout)


@pytest.fixture(scope="module")
def spoken(served: Listening) -> np.ndarray:
    """The Pipeline API's greedy audio for TEXT in speaker 0, as the routes send it: pcm16."""

    async def run() -> Any:
        request = await served.pipeline.submit({"text": TEXT, "sampling": {"temperature": 0, "max_tokens": FRAMES}})
        return (await request.result())["mimi_decoder"]

    audio = on_loop(served, run())
    assert isinstance(audio, AudioResult) and audio.sample_rate == RATE
    assert audio.samples.size == FRAMES * 1920  # 80 ms a frame: the request's bound was reached
    return float_to_pcm16(audio.samples)


def speech(served: Listening, **fields: Any) -> httpx.Response:
    body = {"model": "csm", "input": TEXT, "temperature": 0, "max_new_tokens": FRAMES, **fields}
    return httpx.post(served.url + "/v1/audio/speech", json=body, timeout=120)


def test_speech_as_wav_is_the_pipeline_apis_audio(served: Listening, spoken: np.ndarray) -> None:
    answer = speech(served, response_format="wav")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(answer.content)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    # The WAV is written by FFmpeg's pcm_s16le encoder (serving/speech/encode.py), whose float
    # to int16 rule scales by 32768, not omnictl's 32767 (omnictl/audio/pcm.py): a sample may
    # differ by one step, no more, and there are exactly as many.
    assert samples.shape == spoken.shape
    assert np.abs(samples.astype(np.int32) - spoken.astype(np.int32)).max() <= 1


def test_speech_as_server_sent_events_streams_the_pipeline_apis_audio(served: Listening, spoken: np.ndarray) -> None:
    events = []
    with httpx.stream(
        "POST",
        served.url + "/v1/audio/speech",
        json={
            "model": "csm",
            "input": TEXT,
            "temperature": 0,
            "max_new_tokens": FRAMES,
            "response_format": "pcm",
            "stream_format": "sse",
        },
        timeout=120,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1, "the audio came whole, not as frames were decoded"
    assert events[-1]["type"] == "speech.audio.done"
    np.testing.assert_array_equal(np.frombuffer(b"".join(deltas), dtype="<i2"), spoken)


def test_chat_completions_with_audio_out_speak_the_pipeline_apis_audio(served: Listening, spoken: np.ndarray) -> None:
    body = {
        "model": "csm",
        "messages": [{"role": "user", "content": TEXT}],
        "modalities": ["audio"],
        "audio": {"format": "pcm16"},
        "temperature": 0,
        "max_tokens": FRAMES,
        "stream": True,
    }
    pieces = []
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :]).get("choices") or []:
                audio = (choice.get("delta") or {}).get("audio") or {}
                if audio.get("data"):
                    pieces.append(base64.b64decode(audio["data"]))
    assert len(pieces) > 1, "the audio came whole, not as frames were decoded"
    np.testing.assert_array_equal(np.frombuffer(b"".join(pieces), dtype="<i2"), spoken)
    assert on_loop(served, held_by(served.pipeline)) == []
