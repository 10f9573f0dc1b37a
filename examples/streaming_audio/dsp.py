"""Two streaming audio stages (the stock ``StreamingScheduler``): a gain, then a low-pass
filter. Each takes the ``AudioChunk`` stream of its upstream (for ``gain``: the caller's
streamed input) and emits an ``AudioChunk`` per window as soon as the window is complete."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from omnictl.outputs import AudioChunk
from omnictl.schedulers.streaming import StreamingScheduler, Window

SAMPLE_RATE = 48_000
WINDOW = 4_800  # samples per window: 100 ms (19 KB of float32: over the inline limit, so in a slot)


def _samples(chunk: Any) -> np.ndarray:
    return np.asarray(chunk.samples, dtype=np.float32)


def _count(_request_id: str, _params: Mapping[str, Any], outputs: list[Any]) -> dict[str, int]:
    # `gain`'s result: its audio already went to `lowpass` chunk by chunk, so only a count
    return {"chunks": len(outputs)}


def gain(gain: float = 0.5) -> StreamingScheduler:
    """Multiplies each window by ``gain``."""

    def run(window: Window) -> AudioChunk:
        return AudioChunk(samples=window.new * np.float32(gain), sample_rate=SAMPLE_RATE)

    return StreamingScheduler(run, chunk_size=WINDOW, units=_samples, finish=_count)


def lowpass(taps: int = 16) -> StreamingScheduler:
    """A moving-average FIR filter of ``taps`` taps. Each window carries the ``taps - 1``
    samples before it as context, so the output is the same as filtering the whole signal
    at once (from silence)."""
    kernel = np.full(taps, 1.0 / taps, dtype=np.float32)

    def run(window: Window) -> AudioChunk:
        context = np.concatenate([np.zeros(taps - 1 - len(window.context), np.float32), window.context])
        filtered = np.convolve(np.concatenate([context, window.new]), kernel, mode="valid")
        return AudioChunk(samples=filtered.astype(np.float32), sample_rate=SAMPLE_RATE)

    # finish_on="request": a `next` target too, its stream ends with gain's result; the default
    # finish joins the chunks into one AudioResult: the whole filtered signal
    return StreamingScheduler(run, chunk_size=WINDOW, left_context=taps - 1, units=_samples, finish_on="request")


def reference(signal: np.ndarray, gain: float = 0.5, taps: int = 16) -> np.ndarray:
    """What the pipeline makes of ``signal``, computed at once (for the checks)."""
    kernel = np.full(taps, 1.0 / taps, dtype=np.float32)
    scaled = signal.astype(np.float32) * np.float32(gain)
    return np.convolve(np.concatenate([np.zeros(taps - 1, np.float32), scaled]), kernel, mode="valid")
