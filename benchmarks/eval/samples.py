"""Spoken sample questions for tests, benchmarks and the README.

Small 16 kHz mono WAV files shipped in ``omnictl/data/samples`` (spoken by the Piper
voice). Regenerate them with ``python -m benchmarks.eval.samples [OUT_DIR]``.
"""

from __future__ import annotations

import base64
import io
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

from omnictl.data import SAMPLES, data_path
from omnictl.inputs import read_wav, resample

SAMPLE_RATE = 16_000
QUESTIONS: dict[str, str] = {
    "capital_of_france": "What is the capital of France?",
    "spider_legs": "How many legs does a spider have?",
    "sky_colour": "What colour is the sky?",
    "largest_planet": "What is the largest planet in the solar system?",
    "days_in_a_week": "How many days are in a week?",
}


def sample_names() -> list[str]:
    return list(QUESTIONS)


def sample_text(name: str) -> str:
    """What the sample says."""
    _check(name)
    return QUESTIONS[name]


def sample_path(name: str) -> Path:
    _check(name)
    return data_path(SAMPLES) / f"{name}.wav"


def sample_question(name: str) -> tuple[np.ndarray, int]:
    """The spoken question as float32 mono samples and their rate."""
    return read_wav(sample_path(name).read_bytes(), field=f"sample {name!r}")


def sample_request(name: str, sampling: dict[str, Any] | None = None, voice: str | None = None) -> dict[str, Any]:
    """Pipeline ``inputs`` asking the sample's question out loud (a base64 WAV part)."""
    data = base64.b64encode(sample_path(name).read_bytes()).decode("ascii")
    message = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}
    inputs: dict[str, Any] = {"messages": [message], "sampling": dict(sampling or {})}
    if voice is not None:
        inputs["voice"] = voice
    return inputs


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit PCM mono WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes((np.clip(samples, -1.0, 1.0) * 32767).round().astype("<i2").tobytes())
    return buffer.getvalue()


def write_samples(out_dir: Path) -> list[Path]:
    """Speak every question with Piper and write ``<name>.wav`` files at 16 kHz."""
    from omnictl.models.voice_assistant.tts import PiperSpeaker

    speaker = PiperSpeaker()
    out_dir.mkdir(parents=True, exist_ok=True)
    pad = np.zeros(SAMPLE_RATE // 5, dtype=np.float32)  # a little silence either side, as a microphone would record
    written = []
    for name, text in QUESTIONS.items():
        speech = resample(speaker.synthesize(text), speaker.sample_rate, SAMPLE_RATE)
        path = out_dir / f"{name}.wav"
        path.write_bytes(wav_bytes(np.concatenate([pad, speech, pad]), SAMPLE_RATE))
        written.append(path)
    return written


def _check(name: str) -> None:
    if name not in QUESTIONS:
        raise KeyError(f"no sample question {name!r}; known: {', '.join(QUESTIONS)}")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else data_path(SAMPLES)
    for written_path in write_samples(target):
        print(f"{written_path}  {written_path.stat().st_size // 1024} KiB")
