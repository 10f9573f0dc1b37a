"""The WAV reader: RIFF/WAVE, PCM 8/16/24/32-bit or float, any channel count, to float32 mono."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from omnictl.audio.bounds import MAX_RATE, MIN_RATE
from omnictl.exceptions import InvalidRequest

_PCM_DTYPES: dict[int, np.dtype[Any]] = {8: np.dtype(np.uint8), 16: np.dtype("<i2"), 32: np.dtype("<i4")}


def _fail(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {problem}", field=field)


def read_wav(raw: bytes, field: str = "audio", max_samples: int | None = None) -> tuple[np.ndarray, int]:
    """Mono float32 samples and the rate of a RIFF/WAVE file (PCM 8/16/24/32-bit or float).

    ``max_samples`` bounds the samples (all channels counted) its data chunk may hold:
    more is refused before any is converted (:func:`decode_budget`)."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise _fail(field, "not a WAV file (no RIFF/WAVE header)")
    fmt: tuple[int, int, int, int] | None = None
    offset = 12
    while offset + 8 <= len(raw):
        chunk_id, size = raw[offset : offset + 4], struct.unpack_from("<I", raw, offset + 4)[0]
        body = raw[offset + 8 : offset + 8 + size]  # a streamed WAV marks the data size 0xFFFFFFFF
        if chunk_id == b"fmt " and len(body) >= 16:
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the real tag is in the GUID
                tag = struct.unpack_from("<H", body, 24)[0]
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            if fmt is None:
                raise _fail(field, "WAV file has its data before its fmt chunk")
            if max_samples is not None and fmt[3] >= 8 and len(body) // (fmt[3] // 8) > max_samples:
                raise _fail(
                    field,
                    f"WAV data holds {len(body) // (fmt[3] // 8):,} samples ({fmt[1]} channel(s) at {fmt[2]} Hz); "
                    f"the limit is {max_samples:,} decoded samples",
                )
            return _wav_samples(body, *fmt, field=field), fmt[2]
        offset += 8 + size + (size & 1)
    raise _fail(field, "WAV file has no data chunk" if fmt else "WAV file has no fmt chunk")


def _wav_samples(body: bytes, tag: int, channels: int, rate: int, bits: int, field: str) -> np.ndarray:
    if channels < 1:
        raise _fail(field, f"WAV header is broken ({channels} channels)")
    # As for pcm16's `sample_rate`: a header claiming 1 Hz would make a few KB resample for minutes.
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _fail(field, f"WAV sample rate must be between {MIN_RATE} and {MAX_RATE} Hz, got {rate}")
    if tag == 1 and bits in (8, 16, 32):
        ints = np.frombuffer(body[: len(body) - len(body) % (bits // 8)], dtype=_PCM_DTYPES[bits]).astype(np.float32)
        samples = (ints - 128.0) / 128.0 if bits == 8 else ints / float(2 ** (bits - 1))
    elif tag == 1 and bits == 24:
        triples = np.frombuffer(body[: len(body) - len(body) % 3], dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        packed = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        samples = (np.where(packed >= 1 << 23, packed - (1 << 24), packed) / float(1 << 23)).astype(np.float32)
    elif tag == 3 and bits in (32, 64):
        samples = np.frombuffer(body[: len(body) - len(body) % (bits // 8)], dtype=f"<f{bits // 8}").astype(np.float32)
    else:
        raise _fail(field, f"unsupported WAV encoding (format tag {tag}, {bits} bits); send PCM or float WAV")
    frames = samples.size // channels
    # Several channels are averaged: every model here hears mono.
    mono: np.ndarray = samples[: frames * channels].reshape(frames, channels).mean(axis=1, dtype=np.float32)
    return mono
