"""PCM16 ↔ float with one rounding rule, and base64 PCM16 with its checks."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from omnictl.audio import decode_base64, float_to_pcm16, float_to_pcm16_bytes, pcm16_base64, pcm16_to_float
from omnictl.exceptions import InvalidRequest, PayloadTooLarge


def test_the_one_rounding_rule_is_symmetric_clipped_and_to_nearest() -> None:
    samples = np.array([1.0, -1.0, 2.0, -2.0, 0.0, 0.5, -0.5, 1.4 / 32767, 1.6 / 32767, -1.6 / 32767], np.float32)
    assert float_to_pcm16(samples).tolist() == [32767, -32767, 32767, -32767, 0, 16384, -16384, 1, 2, -2]
    assert float_to_pcm16_bytes(np.array([1.0, -1.0], np.float32)) == np.array([32767, -32767], "<i2").tobytes()


def test_reading_is_int16_over_32768_from_arrays_and_bytes() -> None:
    every = np.arange(-32768, 32768, dtype=np.int16)
    floats = pcm16_to_float(every)
    assert floats.dtype == np.float32 and floats[0] == -1.0 and floats[-1] == 32767 / 32768
    assert np.array_equal(pcm16_to_float(every.astype("<i2").tobytes()), floats)
    # Written back by the one rule, every value is within one step of where it started.
    assert np.abs(float_to_pcm16(floats).astype(np.int32) - every).max() <= 1


def test_base64_pcm16_is_checked_before_and_after_decoding() -> None:
    pcm = np.array([0, 16384, -32768], "<i2").tobytes()
    assert pcm16_base64(base64.b64encode(pcm).decode(), "f").tolist() == [0.0, 0.5, -1.0]
    with pytest.raises(InvalidRequest, match="whole 16-bit samples, got 3 bytes") as odd:
        pcm16_base64(base64.b64encode(b"abc").decode(), "a.data")
    assert odd.value.field == "a.data"
    with pytest.raises(InvalidRequest, match="not valid base64") as bad:
        pcm16_base64("@@@@", "a.data")
    assert bad.value.field == "a.data"
    with pytest.raises(PayloadTooLarge, match="decodes to more than 4 bytes"):
        decode_base64(base64.b64encode(bytes(6)).decode(), "a.data", max_bytes=4)
    assert decode_base64(base64.b64encode(bytes(4)).decode(), "a.data", max_bytes=4) == bytes(4)
