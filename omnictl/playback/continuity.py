"""The playback clock of one audio stream: what a listener would hear, gap by gap.

Audio starts playing when its first chunk leaves (or, on a client, arrives) and plays in
real time from then. An **underrun** is the time the listener waits with nothing to play:
a chunk that comes after the audio before it has run out. The clock is pure arithmetic on
(time, seconds of audio) pairs, so the server (send times), ``omnictl bench`` (receive
times) and the tests (synthetic timings) compute the same figures the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# gaps counted per stream: a 50 ms gap is audible, 100 ms is a stutter, 250 ms a break
GAP_THRESHOLDS_MS = (50, 100, 250)


@dataclass(frozen=True)
class Underrun:
    """One gap: the listener's audio ran out at ``at`` and the next chunk came ``seconds`` later."""

    at: float  # the clock's time when the audio ran out
    seconds: float
    chunk: int  # index of the late chunk


@dataclass(frozen=True)
class Continuity:
    """The figures of one stream (seconds; ``rtf``: time to the last chunk / audio length)."""

    ttfp_s: float | None
    rtf: float | None
    audio_s: float
    chunks: int
    largest_underrun_s: float
    total_underrun_s: float
    gaps_over: dict[int, int]  # threshold in ms -> gaps longer than it
    intervals_s: tuple[float, ...]  # between consecutive chunks
    underruns: tuple[Underrun, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "ttfp_s": self.ttfp_s,
            "rtf": self.rtf,
            "audio_s": self.audio_s,
            "chunks": self.chunks,
            "largest_underrun_s": self.largest_underrun_s,
            "total_underrun_s": self.total_underrun_s,
            "gaps_over_ms": {str(k): v for k, v in self.gaps_over.items()},
        }


@dataclass
class PlaybackClock:
    """Feed it each chunk's time and length with :meth:`chunk`; read :meth:`report`.

    ``start``: when the request was made (TTFP and RTF count from it); all times on one
    monotonic clock (``time.perf_counter()`` in the server and the bench client).
    """

    start: float
    thresholds_ms: tuple[int, ...] = GAP_THRESHOLDS_MS
    first_at: float | None = None
    last_at: float | None = None
    audio_s: float = 0.0
    played_until: float = 0.0  # when the audio sent so far runs out
    chunks: int = 0
    intervals: list[float] = field(default_factory=list)
    underruns: list[Underrun] = field(default_factory=list)

    def chunk(self, at: float, seconds: float) -> float:
        """One chunk of ``seconds`` of audio left (arrived) at ``at``; returns the underrun it
        ended (0 when the listener still had audio). A chunk with no audio is not a chunk."""
        if seconds < 0:
            raise ValueError(f"a chunk's length must be >= 0 seconds, got {seconds}")
        if seconds == 0:
            return 0.0
        if self.last_at is not None and at < self.last_at:
            raise ValueError(f"chunk times must not go back: {at} after {self.last_at}")
        gap = 0.0
        if self.first_at is None:
            self.first_at = at
            self.played_until = at
        else:
            assert self.last_at is not None
            self.intervals.append(at - self.last_at)
            if at > self.played_until:
                gap = at - self.played_until
                self.underruns.append(Underrun(self.played_until, gap, self.chunks))
                self.played_until = at
        self.played_until += seconds
        self.audio_s += seconds
        self.last_at = at
        self.chunks += 1
        return gap

    def slack(self, now: float) -> float:
        """Seconds of sent audio the listener has left at ``now`` (negative: it is starving).
        Before the first chunk there is no playback yet: 0."""
        if self.first_at is None:
            return 0.0
        return self.played_until - now

    def report(self) -> Continuity:
        gaps = [u.seconds for u in self.underruns]
        ttfp = None if self.first_at is None else self.first_at - self.start
        rtf = None
        if self.last_at is not None and self.audio_s > 0:
            rtf = (self.last_at - self.start) / self.audio_s
        return Continuity(
            ttfp_s=ttfp,
            rtf=rtf,
            audio_s=self.audio_s,
            chunks=self.chunks,
            largest_underrun_s=max(gaps, default=0.0),
            total_underrun_s=sum(gaps),
            gaps_over={ms: sum(1 for g in gaps if g * 1000 > ms) for ms in self.thresholds_ms},
            intervals_s=tuple(self.intervals),
            underruns=tuple(self.underruns),
        )
