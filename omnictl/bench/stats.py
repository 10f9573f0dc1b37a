"""Per-request figures and their summaries (mean and percentiles)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

from omnictl.playback.continuity import GAP_THRESHOLDS_MS, Continuity, PlaybackClock

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one request measured, in seconds from when it was sent."""

    index: int
    request_id: str | None = None
    ok: bool = False
    error: str | None = None
    overloaded: bool = False  # refused by admission control (429): load shed, not a failure
    sent_at: float = 0.0  # seconds since the measured run began
    ttft: float | None = None  # first text delta
    ttfa: float | None = None  # first audio delta
    e2e: float | None = None  # last byte of the response
    last_audio: float | None = None  # last audio delta
    itl: list[float] = field(default_factory=list)  # gaps between successive text deltas
    output_tokens: int = 0
    audio_seconds: float = 0.0
    # (received at, seconds of audio) per audio delta: the client's receive clock
    audio_chunks: list[tuple[float, float]] = field(default_factory=list)
    input_seconds: float = 0.0  # the audio sent to be transcribed (the transcriptions route)

    def continuity(self) -> Continuity:
        """The playback clock over this request's audio as received: playing starts with the
        first chunk's arrival, underruns are the waits after the audio received ran out."""
        clock = PlaybackClock(0.0)
        for at, seconds in self.audio_chunks:
            clock.chunk(at, seconds)
        return clock.report()

    @property
    def largest_underrun(self) -> float | None:
        return self.continuity().largest_underrun_s if self.audio_chunks else None

    @property
    def rtf(self) -> float | None:
        """Real-time factor (< 1: faster than real time): time spent producing audio ÷ the
        audio's duration; for a transcription, its latency ÷ the duration of the audio heard."""
        if self.last_audio is not None and self.audio_seconds > 0:
            return self.last_audio / self.audio_seconds
        if self.input_seconds > 0 and self.e2e is not None:
            return self.e2e / self.input_seconds
        return None

    def as_dict(self) -> dict[str, Any]:
        continuity = self.continuity().as_dict() if self.audio_chunks else None
        return {**asdict(self), "rtf": self.rtf, "continuity": continuity}


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Iterable[float | None]) -> Summary:
    data = np.array([v for v in values if v is not None], dtype=np.float64)
    if data.size == 0:
        return Summary(0, None, None, None, None)
    p50, p90, p99 = (float(x) for x in np.percentile(data, PERCENTILES))
    return Summary(int(data.size), float(data.mean()), p50, p90, p99)


def latency_summaries(records: list[RequestRecord]) -> dict[str, Summary]:
    done = [r for r in records if r.ok]
    return {
        "ttft": summarize(r.ttft for r in done),
        "ttfa": summarize(r.ttfa for r in done),
        "itl": summarize(gap for r in done for gap in r.itl),
        "e2e": summarize(r.e2e for r in done),
        "rtf": summarize(r.rtf for r in done),
        "largest_underrun": summarize(r.largest_underrun for r in done),
        "total_underrun": summarize(r.continuity().total_underrun_s for r in done if r.audio_chunks),
        "chunk_interval": summarize(gap for r in done for gap in r.continuity().intervals_s),
    }


def continuity_summary(records: list[RequestRecord]) -> dict[str, Any]:
    """Over the completed requests that received audio: gaps over each threshold, and the
    share of streams whose largest underrun stayed at or under it (continuity)."""
    reports = [r.continuity() for r in records if r.ok and r.audio_chunks]
    return {
        "streams": len(reports),
        "gaps_over_ms": {str(ms): sum(c.gaps_over[ms] for c in reports) for ms in GAP_THRESHOLDS_MS},
        "continuity": {
            str(ms): (sum(c.largest_underrun_s * 1000 <= ms for c in reports) / len(reports) if reports else None)
            for ms in GAP_THRESHOLDS_MS
        },
    }


def throughput(records: list[RequestRecord], duration: float) -> dict[str, float]:
    done = [r for r in records if r.ok]
    if duration <= 0:
        return {"requests_per_s": 0.0, "output_tokens_per_s": 0.0, "audio_seconds_per_s": 0.0}
    return {
        "requests_per_s": len(done) / duration,
        "output_tokens_per_s": sum(r.output_tokens for r in done) / duration,
        "audio_seconds_per_s": sum(r.audio_seconds for r in done) / duration,
    }
