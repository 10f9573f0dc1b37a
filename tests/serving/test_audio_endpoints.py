"""`/v1/audio/speech` and `/v1/audio/transcriptions` through the official `openai` client,
against a real `omnictl serve` of the embedded voice assistant (real Whisper, real Piper)."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from omnictl.inputs import read_wav
from benchmarks.eval.samples import sample_path
from tests.serving.harness import API_KEY, ServerProcess

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture()
def client(voice_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=voice_server.url + "/v1", api_key=API_KEY, timeout=120, max_retries=0)


def heard(whisper: Any, samples: np.ndarray, rate: int) -> str:
    return str(whisper.transcribe(samples, rate)).lower()


def test_speech_as_wav_says_the_input(client: openai.OpenAI, whisper: Any) -> None:
    response = client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE, response_format="wav")
    samples, rate = read_wav(response.content)
    assert rate == 22_050 and samples.size > rate  # Piper's rate; over a second of speech
    text = heard(whisper, samples, rate)
    assert "fox" in text and "dog" in text, text


def test_speech_as_streamed_pcm_says_the_input(client: openai.OpenAI, whisper: Any) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="voice-assistant", voice="alloy", input="Hello there. The sky is blue today.", response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        pieces = list(response.iter_bytes())
    pcm = b"".join(pieces)
    assert len(pcm) % 2 == 0 and len(pcm) > 24_000  # 24 kHz 16-bit: over half a second
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    text = heard(whisper, samples, 24_000)
    assert "sky" in text and "blue" in text, text


def test_speech_as_server_sent_events(voice_server: ServerProcess, whisper: Any) -> None:
    body = {"model": "voice-assistant", "input": "Hello there. The sky is blue today.", "response_format": "pcm",
            "stream_format": "sse"}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", voice_server.url + "/v1/audio/speech", json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"  # one delta per sentence, as spoken
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert events[-1]["seconds"] == pytest.approx(len(pcm) / 2 / 24_000, abs=0.01)
    assert "blue" in heard(whisper, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0, 24_000)


def test_transcription_of_a_spoken_question(client: openai.OpenAI) -> None:
    with open(sample_path("spider_legs"), "rb") as wav:
        result = client.audio.transcriptions.create(model="voice-assistant", file=wav)
    assert "spider" in result.text.lower() and "legs" in result.text.lower()


def test_transcription_formats(client: openai.OpenAI) -> None:
    audio = sample_path("capital_of_france").read_bytes()
    text = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", audio), response_format="text")
    assert isinstance(text, str) and "france" in text.lower()
    verbose = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", audio),
                                                 response_format="verbose_json", language="en")
    samples, rate = read_wav(audio)
    assert verbose.language == "en" and verbose.duration == pytest.approx(samples.size / rate, abs=0.01)
    assert "france" in verbose.text.lower()


def test_transcription_of_the_spoken_answer_round_trips(client: openai.OpenAI) -> None:
    spoken = client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE, response_format="wav")
    result = client.audio.transcriptions.create(model="voice-assistant", file=("answer.wav", spoken.content))
    assert "fox" in result.text.lower()


def test_bad_requests_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.speech.create(model="voice-assistant", voice="alloy", input="hi", response_format="ogg")  # type: ignore[arg-type]
    assert error.value.body["param"] == "response_format" and "mp3, opus, aac, flac, wav, pcm" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.speech.create(model="voice-assistant", voice="alloy", input="")
    assert error.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.transcriptions.create(model="voice-assistant", file=("notes.txt", b"not audio at all"))
    # the formats taken, never FFmpeg's own words (they told a client which server files exist)
    assert error.value.body["param"] == "file" and "not an audio file of a format taken here" in error.value.body["message"]
    assert "FFmpeg" not in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", sample_path("sky_colour").read_bytes()),
                                           response_format="docx")  # type: ignore[arg-type]
    assert error.value.body["param"] == "response_format"


def test_models_lists_the_endpoints_served(client: openai.OpenAI) -> None:
    (model,) = client.models.list().data
    assert model.id == "voice-assistant"
    assert set(model.model_extra["endpoints"]) == {
        "/v1/chat/completions", "/v1/realtime", "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/translations"}


def test_a_topology_that_cannot_serve_them_says_so(server: ServerProcess) -> None:
    """The fast topology has text and audio terminals but no transcript terminal, and its
    entry fans out instead of routing text straight to speech."""
    fast = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=30, max_retries=0)
    with pytest.raises(openai.NotFoundError) as error:
        fast.audio.speech.create(model="fast", voice="alloy", input="hello")
    assert "does not serve /v1/audio/speech" in error.value.body["message"]
    with pytest.raises(openai.NotFoundError) as error:
        fast.audio.transcriptions.create(model="fast", file=("q.wav", sample_path("sky_colour").read_bytes()))
    assert "no terminal of modality 'transcript'" in error.value.body["message"]
    assert fast.models.list().data[0].model_extra["endpoints"] == ["/v1/chat/completions", "/v1/realtime"]


def _wav(samples: int, rate: int) -> bytes:
    data = b"\0\0" * samples  # 16-bit mono silence
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt \
        + b"data" + struct.pack("<I", len(data)) + data


def test_the_audio_endpoints_refuse_what_chat_refuses(voice_server: ServerProcess) -> None:
    """The hardened checks live in the shared admission, not in chat completions alone."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    speech = voice_server.url + "/v1/audio/speech"
    plain = httpx.post(speech, content=b'{"input": "hi"}', headers={**auth, "Content-Type": "text/plain"}, timeout=30)
    assert plain.status_code == 415 and plain.json()["error"]["param"] == "Content-Type"
    for body, field in ((b'{"input": "hi \\ud800"}', "input"), (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "body")):
        response = httpx.post(speech, content=body, headers={**auth, "Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text
    transcriptions = voice_server.url + "/v1/audio/transcriptions"
    # A header claiming 1 Hz, and 700 s of audio (over the 600 s limit): both refused, naming the file.
    for wav in (_wav(6_000, 1), _wav(700 * 8_000, 8_000)):
        response = httpx.post(transcriptions, files={"file": ("q.wav", wav)}, data={"model": "voice-assistant"},
                              headers=auth, timeout=30)
        assert response.status_code in (400, 413) and response.json()["error"]["param"] == "file", response.text
