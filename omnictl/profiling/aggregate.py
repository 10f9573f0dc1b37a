"""Live aggregates over the event stream: the library API behind the dashboard and bench.

Counters are totals since start; rates and percentiles cover a sliding window of
``window_s`` seconds (by event timestamp). Batches arrive from several processes, so
events of one request may come out of order (a completion before the hop that preceded
it): matching is symmetric and a finished request's state is kept for a grace period.
``add`` runs for every event of every request, so it keeps to dict and set operations;
in-flight counts are maintained as events arrive, so ``snapshot`` never scans requests.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Iterable

from omnictl.profiling.events import STAGE_KINDS, Event, EventKind, MetaValue
from omnictl.profiling.stats import (  # re-exported: the aggregator's public types
    EdgeStats,
    HeaderStats,
    ProfileSnapshot,
    StageStats,
    Window,
    percentile,
)

__all__ = ["Aggregator", "EdgeStats", "HeaderStats", "ProfileSnapshot", "StageStats", "percentile"]

_GRACE_NS = 10 * 1_000_000_000  # keep a finished request's state this long for late events
_STALE_NS = 600 * 1_000_000_000  # forget a request nothing was heard of for this long
_PURGE_EVERY_NS = 1_000_000_000
_ENDS = {EventKind.COMPLETED: "completed", EventKind.FAILED: "failed", EventKind.ABORTED: "aborted"}
_HOPS = {
    EventKind.HOP_SENT: ("data", True),
    EventKind.STREAM_SENT: ("stream", True),
    EventKind.HOP_RECEIVED: ("data", False),
    EventKind.STREAM_RECEIVED: ("stream", False),
}
_MILESTONES = {EventKind.ADMITTED, EventKind.FIRST_TEXT, EventKind.FIRST_AUDIO, *_ENDS}
# Work inside a stage: the live figures need a stage's arrival and completion, not these
# (unless they carry a batch size). Skipping them early is a quarter of all events.
_INSIDE_STAGE = {
    EventKind.FANIN_WAIT_END,
    EventKind.BUILD_START,
    EventKind.BUILD_END,
    EventKind.PREFILL_START,
    EventKind.PREFILL_END,
    EventKind.FIRST_EMIT,
    EventKind.DECODE_TOKEN,
    EventKind.COMPUTE_START,
    EventKind.COMPUTE_END,
}

Edge = tuple[str, str, str]


class _Request:
    __slots__ = (
        "last_seen",
        "admitted",
        "ended",
        "first_text",
        "first_audio",
        "at_stage",
        "done_at",
        "reported",
        "pending",
    )

    def __init__(self, ts: int) -> None:
        self.last_seen = ts
        self.admitted: int | None = None
        self.ended: int | None = None
        self.first_text: int | None = None
        self.first_audio: int | None = None
        self.at_stage: dict[str, int] = {}  # stage -> first event there
        self.done_at: set[str] = set()
        self.reported: set[str] = set()  # milestones already sampled
        # (edge, seq) -> unmatched sends (True) or receives (False), never both at once
        self.pending: dict[tuple[Edge, MetaValue], list[tuple[bool, Event]]] = {}


class Aggregator:
    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self.started_ns = time.time_ns()
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._open: set[str] = set()  # admitted, not ended
        self._open_at: dict[str, set[str]] = defaultdict(set)  # stage -> requests there, not done
        self._totals = {"completed": 0, "failed": 0, "aborted": 0}
        self._dropped = 0
        self._next_purge = 0
        span_ns = int(window_s * 1e9)

        def window() -> Window:
            return Window(span_ns)

        self._completions = window()
        self._ttft = window()
        self._ttfa = window()
        self._turns = window()  # realtime turns: speech stopped -> first audio sent
        self._stage_process: dict[str, str] = {}
        self._stage_done: dict[str, int] = defaultdict(int)
        self._stage_failed: dict[str, int] = defaultdict(int)
        self._stage_rejected: dict[str, int] = defaultdict(int)
        self._stage_times: dict[str, Window] = defaultdict(window)
        self._batch_sizes: dict[str, Window] = defaultdict(window)
        self._hop_times: dict[Edge, Window] = defaultdict(window)
        self._hop_bytes: dict[Edge, Window] = defaultdict(window)
        self._transports: dict[Edge, str] = {}

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
            completions, stale = self._completions.recent(since)
            ttft, ttft_stale = self._ttft.recent(since)
            ttfa, ttfa_stale = self._ttfa.recent(since)
            turns, turns_stale = self._turns.recent(since)
            ttft, ttfa, turns = sorted(ttft), sorted(ttfa), sorted(turns)
            header = HeaderStats(
                uptime_s=(now - self.started_ns) / 1e9,
                in_flight=len(self._open),
                completed=self._totals["completed"],
                failed=self._totals["failed"],
                aborted=self._totals["aborted"],
                requests_per_s=len(completions) / (self.window_s if stale else span_s),
                ttft_p50_s=percentile(ttft, 50),
                ttft_p99_s=percentile(ttft, 99),
                ttfa_p50_s=percentile(ttfa, 50),
                ttfa_p99_s=percentile(ttfa, 99),
                dropped_events=self._dropped,
                ttft_n=len(ttft),
                ttfa_n=len(ttfa),
                stale=stale or ttft_stale or ttfa_stale or turns_stale,
                turn_p50_s=percentile(turns, 50),
                turn_p90_s=percentile(turns, 90),
                turn_n=len(turns),
            )
            times = {stage: self._stage_times[stage].recent(since) for stage in self._stage_process}
            # Shares among the stages measured in this window (or, for idle ones, among
            # the last window's), so each group sums to 100%.
            totals = {flag: sum(sum(t) for t, s in times.values() if s is flag) for flag in (False, True)}
            stages = {
                stage: self._stage_stats(stage, process, since, span_s, *times[stage], totals[times[stage][1]])
                for stage, process in self._stage_process.items()
            }
            edges = {edge: self._edge_stats(edge, since, span_s) for edge in self._transports}
        return ProfileSnapshot(now, self.window_s, header, stages, edges)

    # -- folding events in -------------------------------------------------------------

    def _add(self, event: Event) -> None:
        kind, ts = event.kind, event.ts
        if kind in _INSIDE_STAGE and not event.meta:
            return
        if kind is EventKind.TURN_MILESTONE:  # a realtime turn, not a pipeline request
            since_stop = event.meta.get("since_stop_s")
            if event.meta.get("milestone") == "first_audio_sent" and isinstance(since_stop, (int, float)):
                self._turns.add(ts, float(since_stop))
            return
        if kind is EventKind.DROPPED:  # bookkeeping, not a request
            count = event.meta.get("count", 0)
            self._dropped += int(count) if isinstance(count, (int, float)) else 0
            return
        if ts < self.started_ns:  # uptime counts from older events fed in (replays, tests)
            self.started_ns = ts
        rid = event.request_id
        request = self._requests.get(rid)
        if request is None:
            request = self._requests[rid] = _Request(ts)
        elif ts > request.last_seen:
            request.last_seen = ts
        stage = event.stage
        if kind is EventKind.FAILED and stage is not None and request.ended is None:
            self._stage_process.setdefault(stage, event.process)
            counts = self._stage_rejected if event.meta.get("rejected") is True else self._stage_failed
            counts[stage] += 1
        if stage is not None and kind in STAGE_KINDS:
            self._at_stage(request, rid, stage, event)
        if kind is EventKind.STAGE_DONE and stage is not None:
            if stage not in request.done_at:
                request.done_at.add(stage)
                self._open_at[stage].discard(rid)
                self._stage_done[stage] += 1
                self._stage_times[stage].add(ts, (ts - request.at_stage[stage]) / 1e9)
        elif kind in _HOPS:
            self._match_hop(request, event)
        elif kind in _MILESTONES:
            self._milestone(request, rid, kind, ts)

    def _at_stage(self, request: _Request, rid: str, stage: str, event: Event) -> None:
        first = request.at_stage.get(stage)
        if first is None:
            request.at_stage[stage] = event.ts
            if stage not in self._stage_process:
                self._stage_process[stage] = event.process
            if request.ended is None and stage not in request.done_at:
                self._open_at[stage].add(rid)
        elif event.ts < first:
            request.at_stage[stage] = event.ts
        if event.meta:
            batch_size = event.meta.get("batch_size")
            if isinstance(batch_size, (int, float)):
                self._batch_sizes[stage].add(event.ts, float(batch_size))

    def _milestone(self, request: _Request, rid: str, kind: EventKind, ts: int) -> None:
        if kind is EventKind.ADMITTED:
            request.admitted = ts
            if request.ended is None:
                self._open.add(rid)
        elif kind in _ENDS:
            if request.ended is not None:
                return
            request.ended = ts
            self._close(rid, request)
            self._totals[_ENDS[kind]] += 1
            self._completions.add(ts, 1.0)
        elif kind is EventKind.FIRST_TEXT and request.first_text is None:
            request.first_text = ts
        elif kind is EventKind.FIRST_AUDIO and request.first_audio is None:
            request.first_audio = ts
        if request.admitted is None:
            return
        # Figures that need two events, which may arrive in either order; each counted once.
        for name, at, window in (
            ("ttft", request.first_text, self._ttft),
            ("ttfa", request.first_audio, self._ttfa),
        ):
            if at is not None and name not in request.reported:
                request.reported.add(name)
                window.add(at, (at - request.admitted) / 1e9)

    def _match_hop(self, request: _Request, event: Event) -> None:
        kind, sending = _HOPS[event.kind]
        meta = event.meta
        here = event.stage or event.process
        edge = (here, str(meta.get("target")), kind) if sending else (str(meta.get("source")), here, kind)
        transport = meta.get("transport")
        if isinstance(transport, str):
            self._transports[edge] = transport
        elif edge not in self._transports:
            self._transports[edge] = ""
        key = (edge, meta.get("seq") if kind == "stream" else None)
        waiting = request.pending.get(key)
        if not waiting or waiting[0][0] is sending:
            request.pending.setdefault(key, []).append((sending, event))
            return
        other = waiting.pop(0)[1]
        sent, received = (event, other) if sending else (other, event)
        self._hop_times[edge].add(received.ts, max(0, received.ts - sent.ts) / 1e9)
        size = sent.meta.get("bytes")
        if isinstance(size, (int, float)):
            self._hop_bytes[edge].add(received.ts, float(size))

    def _close(self, rid: str, request: _Request) -> None:
        """The request no longer counts as in flight, anywhere."""
        self._open.discard(rid)
        for stage in request.at_stage:
            self._open_at[stage].discard(rid)

    def _purge(self, now: int) -> None:
        for rid in [
            rid
            for rid, r in self._requests.items()
            if (r.ended is not None and r.ended < now - _GRACE_NS) or r.last_seen < now - _STALE_NS
        ]:
            self._close(rid, self._requests.pop(rid))
        # Samples fall out of windows on read too; this bounds memory when nobody reads.
        since = now - int(self.window_s * 1e9)
        windows = [self._completions, self._ttft, self._ttfa, self._turns]
        for group in (self._stage_times, self._batch_sizes, self._hop_times, self._hop_bytes):
            windows.extend(group.values())
        for window in windows:
            window.trim(since)

    # -- reading ---------------------------------------------------------------------

    def _stage_stats(
        self, stage: str, process: str, since: int, span_s: float, times: list[float], stale: bool, all_stages: float
    ) -> StageStats:
        ordered = sorted(times)
        batches = self._batch_sizes[stage].values(since)
        return StageStats(
            stage=stage,
            process=process,
            in_flight=len(self._open_at[stage]),
            done=self._stage_done[stage],
            items_per_s=len(times) / (self.window_s if stale else span_s),
            p50_s=percentile(ordered, 50),
            p99_s=percentile(ordered, 99),
            share=sum(times) / all_stages if all_stages > 0 else None,
            batch_size=sum(batches) / len(batches) if batches else None,
            n=len(times),
            failed=self._stage_failed[stage],
            rejected=self._stage_rejected[stage],
            stale=stale,
        )

    def _edge_stats(self, edge: Edge, since: int, span_s: float) -> EdgeStats:
        latencies, stale = self._hop_times[edge].recent(since)
        latencies.sort()
        sizes = self._hop_bytes[edge].recent(since)[0]
        return EdgeStats(
            src=edge[0],
            dst=edge[1],
            kind=edge[2],
            transport=self._transports.get(edge) or None,
            hops=len(latencies),
            p50_s=percentile(latencies, 50),
            p99_s=percentile(latencies, 99),
            mb_per_s=sum(sizes) / 1e6 / (self.window_s if stale else span_s),
            stale=stale,
        )
