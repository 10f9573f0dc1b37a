"""The server's outbound audio track of a WebRTC call: the answer, paced in real time."""

from __future__ import annotations

import asyncio
import fractions
import time
from typing import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime import events as ev

FRAME_SAMPLES = PCM16_RATE * 20 // 1000  # 20 ms at 24 kHz: one outbound frame


class AnswerTrack(MediaStreamTrack):
    """The server's outbound audio track: the answer's pcm16 in 20 ms frames, in real time;
    silence between answers (a track that stops sending makes the browser's jitter buffer guess)."""

    kind = "audio"

    def __init__(self, send: Callable[[ev.ServerEvent], None]) -> None:
        super().__init__()
        self._send = send
        self._queue: list[tuple[str, bytearray]] = []  # (response id, pcm16 24 kHz) to play, in order
        self._playing: str | None = None  # the response whose audio is playing
        self._finished: set[str] = set()  # responses that will send no more audio
        self._start: float | None = None
        self._samples = 0  # samples sent since _start
        self.played_samples = 0  # samples of answers played (not silence)
        self._heard: tuple[str, int] = ("", 0)  # the response playing (or last played), its samples played
        # Told when a response's audio has played to its end (the session's reply is then heard).
        self.on_stopped: Callable[[str], None] | None = None

    # the session's side (responses.AudioOut)
    def play(self, response_id: str, pcm: bytes) -> None:
        if self._queue and self._queue[-1][0] == response_id:
            self._queue[-1][1].extend(pcm)
        else:
            self._queue.append((response_id, bytearray(pcm)))
        if self._playing is None:
            # Said now, not at the next frame: the next frame is at most 20 ms away, and a short
            # answer's response.done may otherwise come before it.
            self._playing = response_id
            self._send(ev.OutputAudioBufferStarted(response_id=response_id))

    def finish(self, response_id: str) -> bool:
        if self._playing == response_id and not self._queue:
            self._stopped()
        elif self._playing == response_id or any(queued == response_id for queued, _ in self._queue):
            self._finished.add(response_id)  # stopped once the track has played the rest
            return True
        return False

    def played_ms(self, response_id: str) -> float:
        played_id, samples = self._heard
        return samples * 1000 / PCM16_RATE if played_id == response_id else 0.0

    def clear(self) -> bool:
        was = self._playing or (self._queue[0][0] if self._queue else None)
        self._queue.clear()
        self._playing = None
        if was is None:
            return False
        self._finished.discard(was)
        self._send(ev.OutputAudioBufferCleared(response_id=was))
        return True

    def _stopped(self) -> None:
        assert self._playing is not None
        stopped = self._playing
        self._send(ev.OutputAudioBufferStopped(response_id=stopped))
        self._finished.discard(stopped)
        self._playing = None
        if self.on_stopped is not None:
            self.on_stopped(stopped)

    def _take(self) -> bytes:
        """The next 20 ms: the answer's audio, or silence."""
        want = FRAME_SAMPLES * 2
        out = bytearray()
        while self._queue and len(out) < want:
            response_id, pcm = self._queue[0]
            if self._playing != response_id:
                if self._playing is not None:
                    self._stopped()
                self._playing = response_id
                self._send(ev.OutputAudioBufferStarted(response_id=response_id))
            piece = pcm[: want - len(out)]
            del pcm[: len(piece)]
            out += piece
            heard_id, heard = self._heard
            self._heard = (response_id, (heard if heard_id == response_id else 0) + len(piece) // 2)
            if not pcm:
                self._queue.pop(0)
        self.played_samples += len(out) // 2
        if not self._queue and self._playing is not None and self._playing in self._finished:
            self._stopped()
        return bytes(out) + bytes(want - len(out))

    # aiortc's side
    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        wait = self._start + self._samples / PCM16_RATE - now
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -0.2:  # the loop was held: play on from now rather than rush to catch up
            self._start = now - self._samples / PCM16_RATE
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(self._take(), "<i2").reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = PCM16_RATE
        frame.pts = self._samples
        frame.time_base = fractions.Fraction(1, PCM16_RATE)
        self._samples += FRAME_SAMPLES
        return frame
