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


@dataclass(frozen=True)
class StageStats:
    stage: str
    process: str
    in_flight: int  # requests that arrived here and are not done here
    done: int  # requests done here, total
    items_per_s: float
    p50_s: float | None  # time at the stage: first input → done
    p99_s: float | None
    share: float | None  # this stage's time / request time, over the window
    batch_size: float | None  # mean of the `batch_size` meta reported in the window


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
    insert; it is almost always an append.
    """

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: list[tuple[int, float]] = []

    def add(self, ts: int, value: float) -> None:
        samples = self.samples
        if not samples or samples[-1][0] <= ts:
            samples.append((ts, value))
        else:
            bisect.insort(samples, (ts, value))

    def trim(self, since_ns: int) -> None:
        cut = bisect.bisect_left(self.samples, (since_ns, -math.inf))
        if cut:
            del self.samples[:cut]

    def values(self, since_ns: int) -> list[float]:
        self.trim(since_ns)
        return [value for _, value in self.samples]


def percentile(ordered: list[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
