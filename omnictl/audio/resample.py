"""One resampler, with a quality setting.

- ``high`` (the default): FFmpeg's band-limited resampler, through PyAV; low-passes going
  down, so speech keeps its shape. In C: 600 s at 48 kHz to 16 kHz in about 1.5 s, where
  the numpy sinc it replaced took minutes. What a model hears goes through it.
- ``fast``: for what only needs to be close, cheaply, on every chunk: linear interpolation
  (a TTS voice's rate to the 24 kHz a client plays), except 24 kHz to 16 kHz (every
  realtime session's audio for its VAD), a 33-tap low-pass and an exact 3:2 decimation
  (one C convolution: 16 s of audio in ~35 ms).

:class:`FrameResampler` is ``high`` over a stream of decoded frames (a WebRTC microphone,
an upload being decoded), its state kept between them. :class:`StreamResampler` is either
quality over a stream of float32 chunks of any sizes (a realtime session's appends, a
streamed transcription's input): its output does not depend on how the stream was cut, and
``N`` samples in are ``round(N * target / rate)`` out when it is flushed (no drift, no
chunk-edge error), where :func:`resample` on each chunk alone filters every edge on its own
and rounds every chunk's length.

``round(samples.size * target / rate)`` samples come back (at least one for ``fast`` of a
non-empty input), float32.
"""

from __future__ import annotations

import math
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


class StreamResampler:
    """:func:`resample` over a stream of float32 mono chunks, the filter's state carried from
    one chunk to the next: what comes out is the same whatever sizes the chunks had (``high``:
    FFmpeg's resampler kept open, sample for sample; ``fast``: the low-pass and interpolation
    of :func:`resample`'s ``fast`` at the exact positions ``k * rate / target``), and
    :meth:`flush` ends the stream with its tail, ``round(N * target / rate)`` samples in all.

    Output lags input by the filter's reach (``high``: 2 to 4 ms; ``fast``: 17 input samples,
    under 1 ms at 24 kHz) and, for chunks under ``batch`` samples, by what is held until
    ``batch`` have come (0.4 ms of 24 kHz audio at the default: each call into FFmpeg costs
    ~25 us, so a stream of one-sample appends is taken in small batches).

    ``aligned``: each push gives exactly what its input is worth on the output clock
    (``round(N * target / rate)`` after ``N`` samples pushed, whatever the chunks), the lag paid
    once as :attr:`delay` samples of silence at the start of the stream (a buffer that must
    hold three samples per 8 kHz sample at every append); :meth:`flush` then gives the rest.
    """

    def __init__(
        self, rate: int, target: int, quality: Quality = "high", *, batch: int = 10, aligned: bool = False
    ) -> None:
        if rate <= 0 or target <= 0:
            raise ValueError(f"StreamResampler: rates must be positive, got {rate} -> {target} Hz")
        if quality not in QUALITIES:
            raise ValueError(f"resample quality must be one of {', '.join(QUALITIES)}, got {quality!r}")
        if batch < 1:
            raise ValueError(f"StreamResampler: batch must be >= 1 sample, got {batch}")
        self.rate, self.target, self.quality = rate, target, quality
        self.taken = 0  # samples pushed so far
        self.given = 0  # samples returned so far
        self.short = 0  # aligned: output samples the filter had not made in time (silence instead)
        self._batch = batch
        self._held: list[np.ndarray] = []  # pushed, not yet resampled (under `batch` of them)
        self._held_size = 0
        self._consumed = 0  # samples the filter has taken
        self._made = 0  # samples the filter has made
        self._flushed = False
        self._av: Any = None  # the open FFmpeg resampler (high)
        # fast: the input still needed (the filter's reach before the next output), from `_x0`
        self._taps = _lowpass(rate, target) if quality == "fast" else np.ones(1, np.float32)
        self._reach = (self._taps.size - 1) // 2
        self._x = np.zeros(self._reach, np.float32)  # the zeros before the stream, as mode="same" pads
        self._x0 = -self._reach
        # aligned: what the filter made, not given yet, after `delay` samples of silence. The
        # delay covers the filter's lag (FFmpeg's is under 4 ms for these rates; fast's under 1)
        # and the batch held back.
        self.delay = 0
        self._ready: list[np.ndarray] = []
        self._ready_size = 0
        if aligned and rate != target:
            self.delay = math.ceil(target * 0.005) + math.ceil(batch * target / rate)
            self._ready, self._ready_size = [np.zeros(self.delay, np.float32)], self.delay
        self._aligned = aligned

    def push(self, samples: np.ndarray) -> np.ndarray:
        """The output ``samples`` completes (possibly none, float32)."""
        if self._flushed:
            raise RuntimeError("StreamResampler: push after flush (the stream has ended)")
        chunk = np.asarray(samples, dtype=np.float32).reshape(-1)
        self.taken += chunk.size
        if self.rate == self.target:
            self.given += chunk.size
            return chunk
        if chunk.size:
            self._held.append(chunk)
            self._held_size += chunk.size
        out = self._run(self._take_held(), end=False) if self._held_size >= self._batch else np.zeros(0, np.float32)
        return self._give(out, int(round(self.taken * self.target / self.rate)) - self.given)

    def flush(self) -> np.ndarray:
        """The rest of the stream: the held input and the filter's tail. Ends the stream."""
        if self._flushed:
            raise RuntimeError("StreamResampler: flushed twice")
        self._flushed = True
        if self.rate == self.target:
            return np.zeros(0, np.float32)
        out = self._run(self._take_held(), end=True)
        return self._give(out, out.size + self._ready_size)

    def _give(self, out: np.ndarray, count: int) -> np.ndarray:
        """``out`` as is; aligned, ``count`` samples from what is ready (``out`` after the rest)."""
        if self._aligned:
            if out.size:
                self._ready.append(out)
                self._ready_size += out.size
            ready = np.concatenate(self._ready) if len(self._ready) > 1 else self._ready[0]
            if ready.size < count:  # the filter lagged more than `delay`: silence, counted
                self.short += count - ready.size
                ready = np.concatenate([ready, np.zeros(count - ready.size, np.float32)])
            out, rest = ready[:count], ready[count:]
            self._ready, self._ready_size = [rest], rest.size
        self.given += out.size
        return np.ascontiguousarray(out, dtype=np.float32)

    def _take_held(self) -> np.ndarray:
        if not self._held:
            return np.zeros(0, np.float32)
        held = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
        self._held, self._held_size = [], 0
        return held

    def _run(self, chunk: np.ndarray, end: bool) -> np.ndarray:
        """What the filter makes of ``chunk`` (and, at the end, its tail)."""
        self._consumed += chunk.size
        out = self._high(chunk, end) if self.quality == "high" else self._fast(chunk, end)
        if end:  # the whole stream's length, as resample() gives it: the tail rounds a sample or two
            want = int(round(self._consumed * self.target / self.rate)) - self._made
            if out.size >= want:
                out = out[: max(0, want)]
            else:
                out = np.concatenate([out, np.zeros(want - out.size, np.float32)])
        self._made += out.size
        return out

    def _high(self, chunk: np.ndarray, end: bool) -> np.ndarray:
        import av

        if self._av is None:
            self._av = av.AudioResampler(format="flt", layout="mono", rate=self.target)
        frames = []
        if chunk.size:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk).reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = self.rate
            frames += self._av.resample(frame)
        if end:
            frames += self._av.resample(None)
        pieces = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def _fast(self, chunk: np.ndarray, end: bool) -> np.ndarray:
        """Output ``k`` is the low-passed input at ``k * rate / target``, interpolated between
        its two neighbours; it is made once the input reaches the filter's reach past both."""
        reach, rate, target = self._reach, self.rate, self.target
        x = np.concatenate([self._x, chunk]) if chunk.size else self._x
        if end:  # the zeros after the stream, as mode="same" pads
            x = np.concatenate([x, np.zeros(reach + 1, np.float32)])
        known = self._x0 + x.size  # input index past the last one in `x`
        # outputs k whose right neighbour (floor(k*rate/target) + 1) has its reach in `x`
        last = known - reach - 2  # the largest usable left neighbour
        stop = max(0, -((-(last + 1) * target) // rate))  # outputs k < stop have floor(k*rate/target) <= last
        if end:
            stop = min(stop, int(round(self._consumed * target / rate)))
        k = np.arange(self._made, max(self._made, stop), dtype=np.int64)
        if k.size == 0:
            self._x = x
            return np.zeros(0, np.float32)
        left = (k * rate) // target
        frac = ((k * rate) % target / target).astype(np.float32)
        first, top = int(left[0]), int(left[-1]) + 1
        window = x[first - reach - self._x0 : top + reach + 1 - self._x0]
        filtered = np.convolve(window, self._taps, mode="valid")  # the low-passed input at first..top
        out = filtered[left - first] * (1 - frac) + filtered[left + 1 - first] * frac
        next_left = ((int(k[-1]) + 1) * rate) // target
        keep_from = next_left - reach  # what the next output's filter reaches back to
        self._x = x[keep_from - self._x0 :] if not end else np.zeros(0, np.float32)
        self._x0 = keep_from
        return out.astype(np.float32, copy=False)


def _lowpass(rate: int, target: int) -> np.ndarray:
    """``fast``'s filter for ``rate`` to ``target``: the 33-tap Hann-windowed sinc at the
    target's Nyquist going down (from 24 to 16 kHz exactly :func:`_lowpass_24k`); none going up."""
    if target >= rate:
        return np.ones(1, np.float32)
    if (rate, target) == (24_000, 16_000):
        return _lowpass_24k()
    n = np.arange(-16, 17)
    cut = target / rate
    taps = cut * np.sinc(cut * n) * (0.5 + 0.5 * np.cos(np.pi * n / 17))
    return (taps / taps.sum()).astype(np.float32)
