"""Live aggregates over the event stream: the library API behind the dashboard and bench.

Counters are totals since start; rates and percentiles cover a sliding window of
``window_s`` seconds (by event timestamp). Batches arrive from several processes, so
events of one request may come out of order (a completion before the hop that preceded
it): matching is symmetric and a finished request's state is kept for a grace period.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable

from omnictl.profiling.events import STAGE_KINDS, Event, EventKind, MetaValue

_GRACE_NS = 10 * 1_000_000_000  # keep a finished request's state this long for late events
_STALE_NS = 600 * 1_000_000_000  # forget a request nothing was heard of for this long
_PURGE_EVERY_NS = 1_000_000_000
_ENDS = {EventKind.COMPLETED: "completed", EventKind.FAILED: "failed", EventKind.ABORTED: "aborted"}
_SEND_KINDS = {EventKind.HOP_SENT: "data", EventKind.STREAM_SENT: "stream"}
_RECEIVE_KINDS = {EventKind.HOP_RECEIVED: "data", EventKind.STREAM_RECEIVED: "stream"}


@dataclass(frozen=True)
class HeaderStats:
    uptime_s: float
    in_flight: int
    completed: int
    failed: int
    aborted: int
    requests_per_s: float  # completions per second over the window
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


@dataclass
class _Request:
    last_seen: int
    admitted: int | None = None
    ended: int | None = None
    first_text: int | None = None
    first_audio: int | None = None
    at_stage: dict[str, int] = field(default_factory=dict)  # stage -> first event there
    done_at: set[str] = field(default_factory=set)
    reported: set[str] = field(default_factory=set)  # milestones already sampled
    sends: dict[tuple[str, str, str, MetaValue], deque[Event]] = field(default_factory=lambda: defaultdict(deque))
    receives: dict[tuple[str, str, str, MetaValue], deque[Event]] = field(default_factory=lambda: defaultdict(deque))


class _Window:
    """(timestamp, value) samples kept in time order; old ones fall out on read.

    Samples arrive out of order (batches from several processes), hence the sorted
    insert; it is almost always an append.
    """

    def __init__(self) -> None:
        self.samples: list[tuple[int, float]] = []

    def add(self, ts: int, value: float) -> None:
        if not self.samples or self.samples[-1][0] <= ts:
            self.samples.append((ts, value))
        else:
            bisect.insort(self.samples, (ts, value))

    def trim(self, since_ns: int) -> None:
        cut = bisect.bisect_left(self.samples, (since_ns, -math.inf))
        if cut:
            del self.samples[:cut]

    def values(self, since_ns: int) -> list[float]:
        self.trim(since_ns)
        return [value for _, value in self.samples]


class Aggregator:
    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self.started_ns = time.time_ns()
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._totals = {"completed": 0, "failed": 0, "aborted": 0}
        self._dropped = 0
        self._next_purge = 0
        self._completions = _Window()
        self._request_times = _Window()
        self._ttft = _Window()
        self._ttfa = _Window()
        self._stage_process: dict[str, str] = {}
        self._stage_done: dict[str, int] = defaultdict(int)
        self._stage_times: dict[str, _Window] = defaultdict(_Window)
        self._batch_sizes: dict[str, _Window] = defaultdict(_Window)
        self._hop_times: dict[tuple[str, str, str], _Window] = defaultdict(_Window)
        self._hop_bytes: dict[tuple[str, str, str], _Window] = defaultdict(_Window)
        self._transports: dict[tuple[str, str, str], str] = {}

    def add(self, events: Iterable[Event]) -> None:
        """Fold a batch of events in; safe to call from any thread."""
        with self._lock:
            for event in events:
                self._add(event)
            now = time.time_ns()
            if now >= self._next_purge:
                self._purge(now)
                self._next_purge = now + _PURGE_EVERY_NS

    def snapshot(self, now: int | None = None) -> ProfileSnapshot:
        """Aggregates as of ``now`` (``time.time_ns()`` when None)."""
        now = time.time_ns() if now is None else now
        since = now - int(self.window_s * 1e9)
        # Rates divide by the window, or by the uptime while it is shorter than the window.
        span_s = max(1e-3, min(self.window_s, (now - self.started_ns) / 1e9))
        with self._lock:
            request_time = sum(self._request_times.values(since))
            ttft, ttfa = sorted(self._ttft.values(since)), sorted(self._ttfa.values(since))
            header = HeaderStats(
                uptime_s=(now - self.started_ns) / 1e9,
                in_flight=sum(1 for r in self._requests.values() if r.admitted is not None and r.ended is None),
                completed=self._totals["completed"],
                failed=self._totals["failed"],
                aborted=self._totals["aborted"],
                requests_per_s=len(self._completions.values(since)) / span_s,
                ttft_p50_s=percentile(ttft, 50),
                ttft_p99_s=percentile(ttft, 99),
                ttfa_p50_s=percentile(ttfa, 50),
                ttfa_p99_s=percentile(ttfa, 99),
                dropped_events=self._dropped,
            )
            stages = {stage: self._stage_stats(stage, process, since, span_s, request_time) for stage, process in self._stage_process.items()}
            edges = {key: self._edge_stats(key, since, span_s) for key in self._transports}
        return ProfileSnapshot(now, self.window_s, header, stages, edges)

    # -- folding events in -------------------------------------------------------------

    def _add(self, event: Event) -> None:
        if event.kind is EventKind.DROPPED:  # bookkeeping, not a request
            count = event.meta.get("count", 0)
            self._dropped += int(count) if isinstance(count, (int, float)) else 0
            return
        # Uptime counts from construction, or from older events fed in (replays, tests).
        self.started_ns = min(self.started_ns, event.ts)
        request = self._requests.get(event.request_id)
        if request is None:
            request = self._requests[event.request_id] = _Request(last_seen=event.ts)
        request.last_seen = max(request.last_seen, event.ts)
        if event.stage is not None and event.kind in STAGE_KINDS:
            self._stage_process.setdefault(event.stage, event.process)
            request.at_stage[event.stage] = min(event.ts, request.at_stage.get(event.stage, event.ts))
            batch_size = event.meta.get("batch_size")
            if isinstance(batch_size, (int, float)):
                self._batch_sizes[event.stage].add(event.ts, float(batch_size))
        kind = event.kind
        if kind is EventKind.ADMITTED:
            request.admitted = event.ts
        elif kind in _ENDS:
            if request.ended is None:
                request.ended = event.ts
                self._totals[_ENDS[kind]] += 1
                self._completions.add(event.ts, 1.0)
        elif kind is EventKind.FIRST_TEXT and request.first_text is None:
            request.first_text = event.ts
        elif kind is EventKind.FIRST_AUDIO and request.first_audio is None:
            request.first_audio = event.ts
        elif kind is EventKind.STAGE_DONE and event.stage is not None and event.stage not in request.done_at:
            request.done_at.add(event.stage)
            self._stage_done[event.stage] += 1
            self._stage_times[event.stage].add(event.ts, (event.ts - request.at_stage[event.stage]) / 1e9)
        elif kind in _SEND_KINDS or kind in _RECEIVE_KINDS:
            self._match_hop(request, event)
        self._request_milestones(request)

    def _request_milestones(self, request: _Request) -> None:
        """Figures that need two events, which may arrive in either order; each counted once."""
        if request.admitted is None:
            return
        for name, ts, window in (
            ("ttft", request.first_text, self._ttft),
            ("ttfa", request.first_audio, self._ttfa),
            ("total", request.ended, self._request_times),
        ):
            if ts is not None and name not in request.reported:
                request.reported.add(name)
                window.add(ts, (ts - request.admitted) / 1e9)

    def _match_hop(self, request: _Request, event: Event) -> None:
        here = event.stage or event.process
        if event.kind in _SEND_KINDS:
            kind, key_src, key_dst = _SEND_KINDS[event.kind], here, str(event.meta.get("target"))
        else:
            kind, key_src, key_dst = _RECEIVE_KINDS[event.kind], str(event.meta.get("source")), here
        seq = event.meta.get("seq") if kind == "stream" else None
        key = (key_src, key_dst, kind, seq)
        edge = (key_src, key_dst, kind)
        transport = event.meta.get("transport")
        if isinstance(transport, str):
            self._transports[edge] = transport
        else:
            self._transports.setdefault(edge, "")
        mine, theirs = (request.sends, request.receives) if event.kind in _SEND_KINDS else (request.receives, request.sends)
        if not theirs[key]:
            mine[key].append(event)
            return
        other = theirs[key].popleft()
        sent, received = (event, other) if event.kind in _SEND_KINDS else (other, event)
        self._hop_times[edge].add(received.ts, max(0, received.ts - sent.ts) / 1e9)
        size = sent.meta.get("bytes")
        if isinstance(size, (int, float)):
            self._hop_bytes[edge].add(received.ts, float(size))

    def _purge(self, now: int) -> None:
        for request_id in [
            rid
            for rid, r in self._requests.items()
            if (r.ended is not None and r.ended < now - _GRACE_NS) or r.last_seen < now - _STALE_NS
        ]:
            del self._requests[request_id]
        # Samples fall out of windows on read too; this bounds memory when nobody reads.
        since = now - int(self.window_s * 1e9)
        windows = [self._completions, self._request_times, self._ttft, self._ttfa]
        for group in (self._stage_times, self._batch_sizes, self._hop_times, self._hop_bytes):
            windows.extend(group.values())
        for window in windows:
            window.trim(since)

    # -- reading ---------------------------------------------------------------------

    def _stage_stats(self, stage: str, process: str, since: int, span_s: float, request_time: float) -> StageStats:
        times = self._stage_times[stage].values(since)
        ordered = sorted(times)
        batches = self._batch_sizes[stage].values(since)
        in_flight = sum(
            1 for r in self._requests.values() if stage in r.at_stage and stage not in r.done_at and r.ended is None
        )
        return StageStats(
            stage=stage,
            process=process,
            in_flight=in_flight,
            done=self._stage_done[stage],
            items_per_s=len(times) / span_s,
            p50_s=percentile(ordered, 50),
            p99_s=percentile(ordered, 99),
            share=sum(times) / request_time if request_time > 0 else None,
            batch_size=sum(batches) / len(batches) if batches else None,
        )

    def _edge_stats(self, edge: tuple[str, str, str], since: int, span_s: float) -> EdgeStats:
        latencies = sorted(self._hop_times[edge].values(since))
        sizes = self._hop_bytes[edge].values(since)
        return EdgeStats(
            src=edge[0],
            dst=edge[1],
            kind=edge[2],
            transport=self._transports.get(edge) or None,
            hops=len(latencies),
            p50_s=percentile(latencies, 50),
            p99_s=percentile(latencies, 99),
            mb_per_s=sum(sizes) / 1e6 / span_s,
        )


def percentile(ordered: list[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
