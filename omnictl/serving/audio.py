"""Waveforms out: float32 mono in [-1, 1] (as :mod:`omnictl.outputs` carries them) →
pcm16 or WAV bytes, base64 for JSON.

``pcm16`` follows the OpenAI convention clients rely on: raw little-endian 16-bit
mono at 24 kHz, so stages at another rate are resampled. ``wav`` keeps the stage's
own rate (the header says it). A streamed WAV is one header (sizes marked unknown,
as streaming WAV writers do) followed by raw pcm16 in every later chunk.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np

from omnictl.inputs import PCM16_RATE  # one definition for audio in and out
_UNKNOWN_SIZE = 0xFFFFFFFF


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear-interpolation resampling; enough for speech at these rates."""
    if rate == target or samples.size == 0:
        return samples
    count = max(1, round(samples.size * target / rate))
    positions = np.linspace(0.0, samples.size - 1, num=count, dtype=np.float64)
    resampled: np.ndarray = np.interp(positions, np.arange(samples.size), samples).astype(np.float32)
    return resampled


def pcm16_bytes(samples: np.ndarray) -> bytes:
    clipped = np.clip(samples, -1.0, 1.0)
    return bytes((clipped * 32767.0).round().astype("<i2").tobytes())


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte PCM16 mono RIFF header; ``data_bytes=None`` marks a stream of unknown length."""
    data_size = _UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff_size = _UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data" + struct.pack("<I", data_size)
    )


def encode_whole(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """One complete waveform (float32 mono) as a WAV file or as 24 kHz pcm16."""
    if fmt == "pcm16":
        return pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
    body = pcm16_bytes(samples)
    return wav_header(sample_rate, len(body)) + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class AudioStreamEncoder:
    """Encodes successive chunks of one response; the first WAV chunk carries the header."""

    fmt: str
    header_sent: bool = False
    seconds: float = 0.0  # audio produced so far

    def encode(self, samples: np.ndarray, sample_rate: int) -> bytes:
        self.seconds += samples.size / sample_rate if sample_rate else 0.0
        if self.fmt == "pcm16":
            return pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
        body = pcm16_bytes(samples)
        if self.header_sent:
            return body
        self.header_sent = True
        return wav_header(sample_rate, None) + body
