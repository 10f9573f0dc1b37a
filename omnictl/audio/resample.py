"""One resampler, with a quality setting.

- ``high`` (the default): FFmpeg's band-limited resampler, through PyAV; low-passes going
  down, so speech keeps its shape. In C: 600 s at 48 kHz to 16 kHz in about 1.5 s, where
  the numpy sinc it replaced took minutes. What a model hears goes through it.
- ``fast``: for what only needs to be close, cheaply, on every chunk: linear interpolation
  (a TTS voice's rate to the 24 kHz a client plays), except 24 kHz to 16 kHz (every
  realtime session's audio for its VAD), a 33-tap low-pass and an exact 3:2 decimation
  (one C convolution: 16 s of audio in ~35 ms).

:class:`FrameResampler` is ``high`` over a stream of decoded frames (a WebRTC microphone,
an upload being decoded), its state kept between them.

``round(samples.size * target / rate)`` samples come back (at least one for ``fast`` of a
non-empty input), float32.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Quality = Literal["high", "fast"]
QUALITIES: tuple[Quality, ...] = ("high", "fast")


def resample(samples: np.ndarray, rate: int, target: int, quality: Quality = "high") -> np.ndarray:
    """``samples`` (float32 mono at ``rate``) at ``target`` Hz; as is when the rates agree."""
    if rate == target:
        return samples
    if quality == "high":
        return _high(samples, rate, target)
    if quality == "fast":
        if (rate, target) == (24_000, 16_000):
            return _three_to_two(samples)
        return _linear(samples, rate, target)
    raise ValueError(f"resample quality must be one of {', '.join(QUALITIES)}, got {quality!r}")


def _high(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    import av  # PyAV: a dependency of omnictl; imported here, as only audio needs it

    count = int(round(samples.size * target / rate))
    if samples.size == 0:
        return np.zeros(0, dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
    )
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=target)
    pieces = [out.to_ndarray().reshape(-1) for out in (*resampler.resample(frame), *resampler.resample(None))]
    out = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if out.size < count:  # the filter's tail may round a sample short
        out = np.concatenate([out, np.zeros(count - out.size, dtype=np.float32)])
    return np.ascontiguousarray(out[:count], dtype=np.float32)


def _linear(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    if samples.size == 0:
        return samples
    count = max(1, round(samples.size * target / rate))
    positions = np.linspace(0.0, samples.size - 1, num=count, dtype=np.float64)
    out: np.ndarray = np.interp(positions, np.arange(samples.size), samples).astype(np.float32)
    return out


_LOWPASS_24K: np.ndarray | None = None


def _lowpass_24k() -> np.ndarray:
    """A 33-tap Hann-windowed sinc low-pass at 8 kHz for 24 kHz audio (unit DC gain)."""
    global _LOWPASS_24K
    if _LOWPASS_24K is None:
        n = np.arange(-16, 17)
        taps = (2 / 3) * np.sinc(2 / 3 * n) * (0.5 + 0.5 * np.cos(np.pi * n / 17))
        _LOWPASS_24K = (taps / taps.sum()).astype(np.float32)
    return _LOWPASS_24K


def _three_to_two(samples: np.ndarray) -> np.ndarray:
    if samples.size == 0:  # np.convolve refuses an empty input; a chunk of nothing is a normal case
        return np.zeros(0, dtype=np.float32)
    filtered = np.convolve(samples.astype(np.float32, copy=False), _lowpass_24k(), mode="same")
    count = int(round(samples.size * 2 / 3))
    out = np.empty(count, dtype=np.float32)
    even = filtered[0::3][: (count + 1) // 2]  # output 2m is input 3m
    out[0::2] = even
    odd_at = np.arange(count // 2) * 3 + 1  # output 2m+1 is input 3m+1.5
    out[1::2] = 0.5 * (filtered[odd_at] + filtered[np.minimum(odd_at + 1, filtered.size - 1)])
    return out


class FrameResampler:
    """The ``high`` resampler over a stream of decoded frames (PyAV ``AudioFrame`` s of any
    format, layout and rate: a codec's output), keeping its filter's state from one frame
    to the next: float32 mono at ``rate`` out, a frame's worth at a time, then
    :meth:`flush` for the filter's tail. Several channels are mixed down to one."""

    def __init__(self, rate: int) -> None:
        import av

        self.rate = rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)

    def push(self, frame: Any) -> np.ndarray:
        return self._joined(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        return self._joined(self._resampler.resample(None))

    @staticmethod
    def _joined(frames: list[Any]) -> np.ndarray:
        pieces = [out.to_ndarray().reshape(-1) for out in frames]
        if not pieces:
            return np.zeros(0, dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(pieces), dtype=np.float32)
