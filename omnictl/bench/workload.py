"""The requests a bench sends: short questions as text, as speech, or alternating (chat
completions); the same questions as text to speak (``/v1/audio/speech``); the spoken
questions to transcribe (``/v1/audio/transcriptions``)."""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import numpy as np

from omnictl.audio import float_to_pcm16
from omnictl.data import SAMPLES, data_path

QUESTIONS = (
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "How many legs does a spider have?",
    "Say hello in one short sentence.",
    "What is two plus two?",
    "Why is the sky blue? Answer briefly.",
)
INPUT_KINDS = ("text", "audio", "mixed")
# The routes a bench can drive, by the name --route takes.
ROUTES = {
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech",
    "transcriptions": "/v1/audio/transcriptions",
}


def tone_wav(seconds: float = 1.0, rate: int = 16_000) -> bytes:
    """A plain tone: valid audio input when no spoken sample is available."""
    t = np.arange(int(seconds * rate)) / rate
    samples = float_to_pcm16(0.3 * np.sin(2 * np.pi * 220 * t))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def spoken_samples() -> list[bytes]:
    """The spoken questions shipped with the package (``omnictl/data/samples``), else a tone."""
    samples_dir = data_path(SAMPLES)
    samples = sorted(samples_dir.glob("*.wav")) if samples_dir.is_dir() else []
    return [path.read_bytes() for path in samples] or [tone_wav()]


def build_payload(
    index: int,
    input_kind: str,
    modalities: list[str],
    max_tokens: int | None,
    audio_wavs: list[bytes],
    model: str,
) -> dict[str, Any]:
    """Request ``index`` of a run: questions rotate, and ``mixed`` alternates text and speech."""
    use_audio = input_kind == "audio" or (input_kind == "mixed" and index % 2 == 1)
    if use_audio:
        wav = audio_wavs[(index // (2 if input_kind == "mixed" else 1)) % len(audio_wavs)]
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
        content: Any = [part]
    else:
        content = QUESTIONS[index % len(QUESTIONS)]
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "modalities": modalities,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if "audio" in modalities:
        payload["audio"] = {"format": "pcm16"}
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    return payload


def pick_route(endpoints: list[str] | None) -> str:
    """The route to measure on a server that serves ``endpoints`` (its ``/v1/models`` lists
    them; None: a server that does not say, taken for a chat server). Chat completions where
    it answers chat, unless it is a speech synthesizer: it takes text to speak and
    recognises no speech (CSM, Higgs Audio; the voice assistant does both, and is a chat
    server); then ``/v1/audio/speech``; a recognizer alone (Qwen3-ASR): transcriptions."""
    if endpoints is None:
        return "chat"
    served = set(endpoints)
    synthesizer = ROUTES["speech"] in served and ROUTES["transcriptions"] not in served
    if ROUTES["chat"] in served and not synthesizer:
        return "chat"
    for route in ("speech", "transcriptions"):
        if ROUTES[route] in served:
            return route
    if ROUTES["chat"] in served:
        return "chat"
    raise ValueError(
        f"the server serves none of the routes the bench drives ({', '.join(ROUTES.values())}); it serves "
        f"{', '.join(endpoints) or 'nothing'} (a full-duplex model such as Moshi is measured by "
        "benchmarks/moshi_duplex.py, not omnictl bench)"
    )


def speech_payload(index: int, max_tokens: int | None, model: str) -> dict[str, Any]:
    """Request ``index`` to ``/v1/audio/speech``: a question to speak, as raw pcm16 (24 kHz)
    streamed as it is made. ``max_tokens`` is the model's ``max_new_tokens`` (CSM's frames)."""
    payload: dict[str, Any] = {
        "model": model,
        "input": QUESTIONS[index % len(QUESTIONS)],
        "response_format": "pcm",
        "stream_format": "audio",
    }
    if max_tokens is not None:
        payload["max_new_tokens"] = max_tokens
    return payload


def transcription_form(index: int, audio_wavs: list[bytes], model: str) -> tuple[dict[str, str], bytes]:
    """Request ``index`` to ``/v1/audio/transcriptions``: its form fields (streamed deltas)
    and the WAV to transcribe (the spoken questions rotate)."""
    return {"model": model, "stream": "true"}, audio_wavs[index % len(audio_wavs)]


def wav_seconds(wav: bytes) -> float:
    """How long a WAV file's audio lasts (the transcription's real-time factor divides by it)."""
    with wave.open(io.BytesIO(wav), "rb") as reader:
        return reader.getnframes() / float(reader.getframerate())
