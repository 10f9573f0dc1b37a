"""The streaming resampler (:class:`omnictl.audio.resample.StreamResampler`): a stream cut into
chunks of any sizes comes out as the whole does, and its length keeps to the input's clock."""

from __future__ import annotations

import numpy as np
import pytest

from omnictl.audio import resample
from omnictl.audio.resample import StreamResampler

NOISE = (0.3 * np.random.default_rng(0).standard_normal(24_000)).astype(np.float32)  # 1 s at 24 kHz


def streamed(resampler: StreamResampler, samples: np.ndarray, size: int) -> np.ndarray:
    pieces = [resampler.push(samples[i : i + size]) for i in range(0, samples.size, size)]
    return np.concatenate([*pieces, resampler.flush()])


@pytest.mark.parametrize("size", [1, 7, 1_001, 4_799])
@pytest.mark.parametrize(
    ("rate", "target", "quality"),
    [(24_000, 16_000, "fast"), (24_000, 16_000, "high"), (8_000, 24_000, "high"), (24_000, 8_000, "high")],
)
def test_a_chunked_stream_equals_the_whole_resampled(rate: int, target: int, quality: str, size: int) -> None:
    """Per chunk, resample() filtered each edge against silence and rounded each chunk's length."""
    samples = NOISE[: rate // 4]  # 250 ms
    whole = resample(samples, rate, target, quality)  # type: ignore[arg-type]
    out = streamed(StreamResampler(rate, target, quality), samples, size)  # type: ignore[arg-type]
    assert out.dtype == np.float32 and out.size == whole.size == round(samples.size * target / rate)
    # fast: the same sums in another order; its very last sample is interpolated with the zero
    # after the stream, where resample() repeats the last one
    assert np.abs(out[:-1] - whole[:-1]).max() < 1e-6


def test_the_fast_stream_keeps_to_the_clock_and_lags_under_a_millisecond() -> None:
    resampler = StreamResampler(24_000, 16_000, "fast")
    for size in [1, 1_001, 4_799] * 30:
        resampler.push(NOISE[:size])
        assert 0 <= round(resampler.taken * 2 / 3) - resampler.given <= 16 + 7  # the reach, and a batch held
    assert resampler.taken == 30 * 5_801


@pytest.mark.parametrize("quality", ["fast", "high"])
def test_aligned_gives_each_push_its_worth_and_pays_the_lag_once_at_the_start(quality: str) -> None:
    resampler = StreamResampler(8_000, 24_000, quality, aligned=True)  # type: ignore[arg-type]
    samples = NOISE[:8_000]
    pieces = []
    for size in [1, 3, 160, 7] * 40:
        start = resampler.taken
        pieces.append(resampler.push(samples[start : start + size]))
        assert pieces[-1].size == round(resampler.taken * 3) - round(start * 3)  # three per sample, at once
    assert resampler.short == 0  # the filter never lagged past the delay
    out = np.concatenate([*pieces, resampler.flush()])
    alone = StreamResampler(8_000, 24_000, quality)  # type: ignore[arg-type]
    plain = np.concatenate([alone.push(samples[: resampler.taken]), alone.flush()])
    assert not out[: resampler.delay].any() and np.abs(out[resampler.delay :] - plain).max() < 1e-6


def test_empty_chunks_same_rates_and_misuse() -> None:
    resampler = StreamResampler(24_000, 16_000)
    assert resampler.push(np.zeros(0, np.float32)).size == 0
    same = StreamResampler(16_000, 16_000)
    assert same.push(NOISE[:5]) is not None and same.given == 5 and same.flush().size == 0
    resampler.flush()
    with pytest.raises(RuntimeError, match="push after flush"):
        resampler.push(NOISE[:5])
    with pytest.raises(ValueError, match="quality must be one of high, fast, got 'best'"):
        StreamResampler(24_000, 16_000, "best")  # type: ignore[arg-type]
