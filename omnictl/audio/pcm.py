"""PCM16 ↔ float32, with one rounding rule, and base64 PCM16 with its checks.

Float samples are in [-1, 1]. Reading: ``int16 / 32768`` (so -32768 is exactly -1).
Writing: clip to [-1, 1], ``× 32767``, round to nearest (ties to even): symmetric, so
±1.0 is ±32767 and a full-scale sine is not clipped on one side. (Before this module,
three writers disagreed: ×32767 truncated, ×32768 rounded, ×32767 rounded.)
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omnictl.exceptions import InvalidRequest, PayloadTooLarge

READ_SCALE = 32768.0
WRITE_SCALE = 32767.0


def pcm16_to_float(pcm: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    """float32 samples of int16 ones (an array, or their little-endian bytes)."""
    ints = np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, (bytes, bytearray, memoryview)) else pcm
    out: np.ndarray = ints.astype(np.float32) / READ_SCALE
    return out


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """int16 samples of float ones, by the one rule (clip, × 32767, round to nearest)."""
    out: np.ndarray = np.rint(np.clip(samples, -1.0, 1.0) * WRITE_SCALE).astype(np.int16)
    return out


def float_to_pcm16_bytes(samples: np.ndarray) -> bytes:
    """Little-endian PCM16 bytes of float samples (:func:`float_to_pcm16`)."""
    return float_to_pcm16(samples).astype("<i2").tobytes()


def decode_base64(encoded: str, field: str, max_bytes: int | None = None) -> bytes:
    """The bytes of base64 text, after its size is checked (:class:`PayloadTooLarge` past
    ``max_bytes``, before decoding); :class:`InvalidRequest` naming ``field`` if it is not base64."""
    if max_bytes is not None and len(encoded) * 3 // 4 - _padding(encoded) > max_bytes:
        raise PayloadTooLarge(f"{field}: decodes to more than {max_bytes} bytes", field=field)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{field}: not valid base64 ({exc})", field=field) from exc


def pcm16_base64(encoded: str, field: str, max_bytes: int | None = None) -> np.ndarray:
    """float32 samples of base64 PCM16 (little-endian), checked: base64, size, whole samples."""
    raw = decode_base64(encoded, field, max_bytes)
    if len(raw) % 2:
        raise InvalidRequest(f"{field}: pcm16 audio must hold whole 16-bit samples, got {len(raw)} bytes", field=field)
    return pcm16_to_float(raw)


def _padding(encoded: str) -> int:
    return 2 if encoded.endswith("==") else 1 if encoded.endswith("=") else 0
