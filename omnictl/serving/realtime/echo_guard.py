"""Echo guard: the assistant's own voice coming back through a client without echo
cancellation (a phone on speaker, a raw WebSocket client, a laptop's speakers) is not
the user speaking.

The server knows what audio it sent and when: it keeps the answer's audio on the
timeline a client playing each delta as it arrives would play it (:meth:`EchoGuard.sent`).
Speech detected while that audio plays (or up to ``TAIL_S`` after) is held for
``WINDOW_MS``, then compared with what was playing over the last ``SEARCH_S`` (any delay):
the best normalised cross-correlation between the input and the played audio, squared, is
the share of the input's energy that a delayed, scaled copy of the answer explains. At
``ECHO_SHARE`` or more it is taken as echo: it neither interrupts the answer nor enters
the input buffer. A different voice over the echo leaves most of the energy unexplained
and barges in (``WINDOW_MS`` later than without the guard). A single delay and gain: a
room's reverberation lowers the share; clients with real echo cancellation (a browser's
``getUserMedia``) turn the guard off (``session.audio.input.echo_guard: false``).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np

from omnictl.serving.realtime.vad import VAD_RATE

WINDOW_MS = 400  # of speech held before it is judged
SEARCH_S = 2.0  # how far back in the played audio an echo may start
TAIL_S = 1.0  # echo may still come back this long after the audio ended
ECHO_SHARE = 0.5  # of the input's energy the played audio explains, from which it is echo
_KEEP_S = 30.0  # of output audio remembered at most


@dataclass
class EchoGuard:
    enabled: bool = True
    judged: list[float] = field(default_factory=list)  # every share computed (the log, the tests)
    _out: collections.deque[tuple[float, np.ndarray]] = field(default_factory=collections.deque)
    _play_end: float = 0.0  # when the audio sent so far ends playing, on the client's clock as estimated
    _in: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def sent(self, audio: np.ndarray, now: float | None = None) -> None:
        """``audio`` (16 kHz) went out: it plays from now, or after what is still playing."""
        now = time.monotonic() if now is None else now
        start = max(self._play_end, now)
        self._out.append((start, audio.astype(np.float32, copy=False)))
        self._play_end = start + audio.size / VAD_RATE
        while self._out and self._out[0][0] + self._out[0][1].size / VAD_RATE < now - _KEEP_S:
            self._out.popleft()

    def stop(self, now: float | None = None) -> None:
        """The client stopped playing (barge-in, cancel, truncate): nothing scheduled after now plays."""
        now = time.monotonic() if now is None else now
        self._play_end = min(self._play_end, now)
        while self._out and self._out[-1][0] >= now:
            self._out.pop()

    def heard(self, audio: np.ndarray) -> None:
        """Input audio (16 kHz) arrived; the last few seconds are kept."""
        self._in = np.concatenate([self._in, audio.astype(np.float32, copy=False)])[-int(VAD_RATE * 3) :]

    def playing(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.enabled and bool(self._out) and now < self._play_end + TAIL_S

    def echo_share(self, window_ms: int, now: float | None = None) -> float:
        """The share of the last ``window_ms`` of input that a delayed, scaled copy of the audio
        played over the last ``SEARCH_S`` explains (0: none of it, 1: all of it)."""
        now = time.monotonic() if now is None else now
        x = self._in[-int(VAD_RATE * window_ms / 1000) :].astype(np.float64)
        x -= x.mean() if x.size else 0.0
        begin = now - window_ms / 1000 - SEARCH_S
        reference = np.zeros(int((now - begin) * VAD_RATE) + 1)
        for start, samples in self._out:
            offset = int(round((start - begin) * VAD_RATE))
            lo, hi = max(0, offset), min(reference.size, offset + samples.size)
            if lo < hi:
                reference[lo:hi] = samples[lo - offset : hi - offset]
        energy_x = float(x @ x)
        if x.size < VAD_RATE // 20 or energy_x <= 1e-9 or reference.size < x.size:
            return 0.0
        size = 1 << int(np.ceil(np.log2(reference.size + x.size)))
        spectrum = np.fft.rfft(reference, size) * np.conj(np.fft.rfft(x, size))
        dots = np.fft.irfft(spectrum, size)[: reference.size - x.size + 1]  # reference[l:l+n] @ x at every lag l
        running = np.concatenate([[0.0], np.cumsum(reference**2)])
        energy_ref = running[x.size :] - running[: -x.size]
        share = float(np.max(dots**2 / (energy_x * np.maximum(energy_ref, 1e-9))))
        self.judged.append(min(share, 1.0))
        return self.judged[-1]
