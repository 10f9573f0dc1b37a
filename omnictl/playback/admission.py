"""Admission by continuity: would one more audio stream make a playing one underrun?

Each playing stream's playback clock says how much audio its listener has left (its
slack) and how often its chunks come. One more stream shares the stages' time with the
``n`` already open, so each one's chunks are predicted to come ``(n + 1) / n`` times as far
apart; a stream whose next chunk would then come after its listener ran out of audio
would underrun by the difference. A stream with one chunk so far is paced by the time
that chunk took to make. The server refuses a new audio request when the
largest predicted underrun is over ``--max-underrun-ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from omnictl.playback.continuity import PlaybackClock


@dataclass(frozen=True)
class Prediction:
    underrun_s: float  # the largest predicted wait of a playing stream's listener (0: none)
    streams: int  # audio streams open (playing or about to)
    retry_after_s: float  # when the stream most at risk is predicted to have caught up


def predict(clocks: Iterable[PlaybackClock], now: float) -> Prediction:
    """The largest underrun of the playing streams if one more stream were admitted at ``now``."""
    clocks = list(clocks)
    n = len(clocks)
    if n == 0:
        return Prediction(0.0, 0, 0.0)
    stretch = (n + 1) / n
    worst = 0.0
    retry = 0.0
    for clock in clocks:
        if clock.last_at is None or clock.first_at is None:
            continue  # not playing yet: no pace to go by
        # its pace: the mean time between its chunks; with one chunk so far, the time
        # that chunk took to make (a sentence TTS sends few, long chunks)
        interval = sum(clock.intervals) / len(clock.intervals) if clock.intervals else clock.first_at - clock.start
        next_chunk = clock.last_at + interval * stretch
        wait = next_chunk - clock.played_until
        if wait > worst:
            worst = wait
            retry = max(0.0, clock.played_until - now) + interval
    return Prediction(worst, n, retry)
