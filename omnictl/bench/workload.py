"""The requests a bench sends: short questions as text, as speech, or alternating."""

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
