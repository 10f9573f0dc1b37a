"""Echo guard: the assistant's own voice coming back through a client without echo
cancellation (a phone on speaker, a raw WebSocket client, a laptop's speakers) is not
the user speaking.

The server knows what audio it sent and when: it estimates when a client playing each
delta as it arrives plays it (:meth:`EchoGuard.sent`). Speech detected while that audio
plays (or up to ``TAIL_S`` after) is held for ``WINDOW_MS``, then compared with the last
``REFERENCE_S`` of audio sent, as one stream (where a client's playback stalls, it stalls
at its own moments, not the server's: the stream, not the timeline, is what comes back).
Piece by piece (``PIECE_MS``), the best normalised cross-correlation between the input and
that stream at any offset, squared, is the share of the piece's energy a delayed, scaled
copy of the answer explains; the pieces' shares weighted by their energy are the input's. At
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
PIECE_MS = 200  # each judged at its own delay
REFERENCE_S = 10.0  # of the audio sent last, where an echo is looked for
TAIL_S = 1.5  # echo may still come back this long after the audio ended (as estimated)
ECHO_SHARE = 0.5  # of the input's energy the played audio explains, from which it is echo


@dataclass
class EchoGuard:
    enabled: bool = True
    judged: list[float] = field(default_factory=list)  # every share computed (the log, the tests)
    _out: collections.deque[np.ndarray] = field(default_factory=collections.deque)  # the audio sent, in order
    _play_end: float = 0.0  # when the audio sent so far ends playing, on the client's clock as estimated
    _in: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def sent(self, audio: np.ndarray, now: float | None = None) -> None:
        """``audio`` (16 kHz) went out: it plays from now, or after what is still playing."""
        if audio.size == 0:  # a clause with nothing to pronounce: nothing plays, not even from now
            return
        now = time.monotonic() if now is None else now
        self._play_end = max(self._play_end, now) + audio.size / VAD_RATE
        self._out.append(audio.astype(np.float32, copy=False))
        while sum(a.size for a in self._out) - self._out[0].size > REFERENCE_S * VAD_RATE:
            self._out.popleft()

    def stop(self, now: float | None = None) -> None:
        """The client stopped playing (barge-in, cancel, truncate): nothing scheduled after now plays."""
        now = time.monotonic() if now is None else now
        self._play_end = min(self._play_end, now)

    def heard(self, audio: np.ndarray) -> None:
        """Input audio (16 kHz) arrived; the last few seconds are kept."""
        self._in = np.concatenate([self._in, audio.astype(np.float32, copy=False)])[-int(VAD_RATE * 3) :]

    def playing(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.enabled and bool(self._out) and now < self._play_end + TAIL_S

    def echo_share(self, window_ms: int) -> float:
        """The share of the last ``window_ms`` of input that a delayed, scaled copy of the audio
        sent explains (0: none of it, 1: all of it)."""
        x = self._in[-int(VAD_RATE * window_ms / 1000) :].astype(np.float64)
        x -= x.mean() if x.size else 0.0
        silence = np.zeros(VAD_RATE // 2)  # an echo may begin before the first sample sent, or after the last
        reference = np.concatenate([silence, *[a.astype(np.float64) for a in self._out], silence])
        energy_x = float(x @ x)
        if x.size < VAD_RATE // 20 or energy_x <= 1e-9 or reference.size < x.size:
            return 0.0
        running = np.concatenate([[0.0], np.cumsum(reference**2)])
        piece = int(VAD_RATE * PIECE_MS / 1000)
        size = 1 << int(np.ceil(np.log2(reference.size + piece)))
        reference_spectrum = np.fft.rfft(reference, size)
        explained = 0.0
        for start in range(0, x.size, piece):
            part = x[start : start + piece]
            energy = float(part @ part)
            if part.size < piece // 2 or energy <= 1e-12:
                continue
            spectrum = reference_spectrum * np.conj(np.fft.rfft(part, size))
            dots = np.fft.irfft(spectrum, size)[: reference.size - part.size + 1]  # reference[l:l+n] @ part
            energy_ref = running[part.size :] - running[: -part.size]
            explained += energy * min(1.0, float(np.max(dots**2 / (energy * np.maximum(energy_ref, 1e-9)))))
        self.judged.append(explained / energy_x)
        return self.judged[-1]
