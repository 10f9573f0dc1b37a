"""Spoken test questions as the Realtime protocol wants them: 24 kHz pcm16 mono."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from benchmarks.eval.samples import sample_question
from omnictl.inputs import PCM16_RATE, read_wav, resample

CHUNK_MS = 100


def pcm16(samples: np.ndarray, rate: int) -> bytes:
    audio = resample(samples.astype(np.float32), rate, PCM16_RATE)
    return bytes((np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes())


def espeak(text: str) -> bytes:
    """``text`` spoken by espeak-ng, as 24 kHz pcm16."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise AssertionError("espeak-ng is not installed (apt-get install espeak-ng; .ci/run installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "q.wav"
        subprocess.run([binary, "-v", "en-us", "-s", "140", "-w", str(wav), text], check=True, capture_output=True, timeout=30)
        samples, rate = read_wav(wav.read_bytes())
    return pcm16(samples, rate)


def sample(name: str) -> bytes:
    """A packaged sample question (Piper, 16 kHz), as 24 kHz pcm16."""
    samples, rate = sample_question(name)
    return pcm16(samples, rate)


def silence(ms: int) -> bytes:
    return bytes(int(PCM16_RATE * ms / 1000) * 2)


def chunks(pcm: bytes, ms: int = CHUNK_MS) -> Iterator[str]:
    """base64 appends of ``ms`` each, as a microphone would send them."""
    step = int(PCM16_RATE * ms / 1000) * 2
    for start in range(0, len(pcm), step):
        yield base64.b64encode(pcm[start : start + step]).decode()


def samples_of(deltas: list[str]) -> np.ndarray:
    pcm = b"".join(base64.b64decode(d) for d in deltas)
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0


def collect_until_done(connection: Any, timeout_events: int = 5000, also: tuple[str, ...] = ()) -> list[Any]:
    """Every server event up to and including the next ``response.done``, and on until each
    event type in ``also`` has come too (a transcription may finish after a short answer)."""
    events = []
    waiting = set(also)
    done = False
    for _ in range(timeout_events):
        event = connection.recv()
        events.append(event)
        waiting.discard(event.type)
        done = done or event.type == "response.done"
        if done and not waiting:
            return events
    raise AssertionError(f"no response.done in {timeout_events} events: {[e.type for e in events][-20:]}")
