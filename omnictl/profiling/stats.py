"""The figures the aggregator reports, and the sliding-window sample store behind them."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class HeaderStats:
    uptime_s: float
    in_flight: int
    completed: int
    failed: int
    aborted: int
    requests_per_s: float  # requests that ended (any outcome) per second over the window
    ttft_p50_s: float | None  # time to first text
    ttft_p99_s: float | None
    ttfa_p50_s: float | None  # time to first audio
    ttfa_p99_s: float | None
    dropped_events: int  # events recorders had to drop (reported by them)
    ttft_n: int = 0  # samples behind the first-text percentiles
    ttfa_n: int = 0
    # Nothing ended within the window: rate and latencies are the last window's (the
    # window ending at the newest sample), shown greyed rather than blanked.
    stale: bool = False
    # Realtime turns: end of speech -> first answer audio sent (the turn_milestone events'
    # first_audio_sent, measured from speech stopped), over the window.
    turn_p50_s: float | None = None
    turn_p90_s: float | None = None
    turn_n: int = 0


@dataclass(frozen=True)
class StageStats:
    stage: str
    process: str
    in_flight: int  # requests that arrived here and are not done here
    done: int  # requests done here, total
    items_per_s: float
    p50_s: float | None  # time at the stage: first input → done
    p99_s: float | None
    # this stage's part of all stages' time in the window: the shares sum to 100%
    share: float | None
    batch_size: float | None  # mean of the `batch_size` meta reported in the window
    n: int = 0  # samples behind items/s and the percentiles
    failed: int = 0  # requests that failed here (its scheduler or routing), total
    rejected: int = 0  # requests whose input this stage could not take, total
    stale: bool = False  # no sample in the window: the figures are the last window's


@dataclass(frozen=True)
class EdgeStats:
    src: str
    dst: str
    kind: str  # data or stream
    transport: str | None
    hops: int  # matched hops in the window
    p50_s: float | None
    p99_s: float | None
    mb_per_s: float  # from the sender's `bytes` meta
    stale: bool = False  # no hop in the window: the figures are the last window's


@dataclass(frozen=True)
class ProfileSnapshot:
    taken_ns: int
    window_s: float
    header: HeaderStats
    stages: dict[str, StageStats]  # in order of first activity
    edges: dict[tuple[str, str, str], EdgeStats]  # (src, dst, kind)


class SnapshotSource(Protocol):
    """Anything that answers ``snapshot()``: an Aggregator, or a collector process's proxy."""

    def snapshot(self, now: int | None = None) -> ProfileSnapshot: ...


class Window:
    """(timestamp, value) samples kept in time order; old ones fall out on read.

    Samples arrive out of order (batches from several processes), hence the sorted
    insert; it is almost always an append. The samples of the last ``span_ns`` before
    the newest one are kept even once they are older than the window, so an idle
    server can still show its last window's figures (greyed) instead of dashes.
    """

    __slots__ = ("samples", "span_ns")

    def __init__(self, span_ns: int = 0) -> None:
        self.samples: list[tuple[int, float]] = []
        self.span_ns = span_ns

    def add(self, ts: int, value: float) -> None:
        samples = self.samples
        if not samples or samples[-1][0] <= ts:
            samples.append((ts, value))
        else:
            bisect.insort(samples, (ts, value))

    def trim(self, since_ns: int) -> None:
        if not self.samples:
            return
        since_ns = min(since_ns, self.samples[-1][0] - self.span_ns)
        cut = bisect.bisect_left(self.samples, (since_ns, -math.inf))
        if cut:
            del self.samples[:cut]

    def values(self, since_ns: int) -> list[float]:
        self.trim(since_ns)
        start = bisect.bisect_left(self.samples, (since_ns, -math.inf))
        return [value for _, value in self.samples[start:]]

    def recent(self, since_ns: int) -> tuple[list[float], bool]:
        """The window's values; when it has none, the last window's and True (stale)."""
        values = self.values(since_ns)
        if values or not self.samples:
            return values, False
        return [value for _, value in self.samples], True


def percentile(ordered: list[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
