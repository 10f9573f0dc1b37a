"""Per-stage time breakdown and per-edge hop latency of the bench's own requests.

Preferred source: the profiler's trace store in the server's run directory (known
when the bench launched the server, or given with ``--run-dir``): exact figures for
exactly the measured requests. Otherwise the server's ``/metrics`` summaries, which
cover the profiler's sliding window (p50 / p99 only).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families

from omnictl.bench.stats import summarize
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore

PARTS = ("fanin_wait", "unpack", "queue", "build", "prefill", "decode")
_ENDS = {EventKind.COMPLETED, EventKind.FAILED, EventKind.ABORTED}
_SETTLE_S = 0.25  # several recorder flush intervals (50 ms each)


def edge_name(src: str, dst: str, kind: str) -> str:
    return f"{src}->{dst}" if kind == "hop" else f"{src}->{dst} (stream)"


def gather(store: TraceStore, wanted: set[str], wait_s: float) -> dict[str, list[Event]]:
    """Events of the wanted requests; waits (up to ``wait_s``) for late batches to land.

    Every process ships its own batches, so a stage's events can land after the
    coordinator's "completed": the store is read until every request has ended and a
    whole settle period brought nothing new.
    """
    deadline = time.monotonic() + wait_s
    previous = -1
    while True:
        grouped: dict[str, list[Event]] = defaultdict(list)
        for event in store.iter_events():
            if event.request_id in wanted:
                grouped[event.request_id].append(event)
        ended = {rid for rid, events in grouped.items() if any(e.kind in _ENDS for e in events)}
        count = sum(len(events) for events in grouped.values())
        if (ended >= wanted and count == previous) or time.monotonic() > deadline:
            return grouped
        previous = count
        time.sleep(_SETTLE_S)  # polling a file other processes append to, under a deadline


# Which part keeps time two parts of one stage share: work first (a TTS stage synthesises
# its first sentence while the fan-in still waits for the rest of the answer), then unpack,
# then the waits. Each overlapping nanosecond is counted once, for the first part listed.
_WAITS = ("unpack", "queue", "fanin_wait")


def _exclusive(parts: list[tuple[str, int, int]]) -> dict[str, float]:
    """Seconds per part over ``(part, start_ns, end_ns)`` intervals of one request at one
    stage, overlapping time counted once (see ``_WAITS``), so the parts never add up to
    more than the stage's own time."""
    ordered = sorted(parts, key=lambda p: (p[0] in _WAITS, _WAITS.index(p[0]) if p[0] in _WAITS else 0, p[1]))
    claimed: list[tuple[int, int]] = []  # disjoint, sorted
    seconds: dict[str, float] = defaultdict(float)
    for part, start, end in ordered:
        free, cursor = 0, start
        for lo, hi in claimed:
            if hi <= cursor or lo >= end:
                continue
            free += max(0, lo - cursor)
            cursor = max(cursor, hi)
        free += max(0, end - cursor)
        seconds[part] += free / 1e9
        merged = sorted([*claimed, (start, end)])
        claimed = []
        for lo, hi in merged:
            if claimed and lo <= claimed[-1][1]:
                claimed[-1] = (claimed[-1][0], max(claimed[-1][1], hi))
            else:
                claimed.append((lo, hi))
    return seconds


def from_trace_store(run_dir: Path, request_ids: Iterable[str], wait_s: float = 5.0) -> dict[str, Any]:
    grouped = gather(TraceStore(run_dir), set(request_ids), wait_s)
    stage_times: dict[str, list[float]] = defaultdict(list)
    part_times: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    edge_times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for request_id, events in grouped.items():
        trace = build_trace(request_id, sorted(events, key=lambda e: e.ts))
        intervals: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for span in trace.spans:
            seconds = span.duration_ns / 1e9
            if span.kind == "stage" and span.stage:
                stage_times[span.stage].append(seconds)
            elif span.kind in PARTS and span.stage:
                intervals[span.stage].append((span.kind, span.start_ns, span.end_ns))
            elif span.kind == "compute" and span.stage:  # a phase the scheduler named
                intervals[span.stage].append((span.name, span.start_ns, span.end_ns))
            elif span.kind in ("hop", "stream") and span.meta.get("received") is not False:
                edge_times[(str(span.meta["src"]), str(span.meta["dst"]), span.kind)].append(seconds)
        for stage, parts in intervals.items():
            for part, seconds in _exclusive(parts).items():
                part_times[stage][part] += seconds
    stages = {}
    for stage, times in stage_times.items():
        named = sorted(
            part_times[stage], key=lambda part: (part not in PARTS, PARTS.index(part) if part in PARTS else 0)
        )
        shares = {part: part_times[stage][part] / len(times) for part in named}
        summary = summarize(times)
        # The rest of the stage's time (waiting on stream input, routing, sending), so the
        # parts add up to the stage's mean.
        shares["other"] = max(0.0, (summary.mean or 0.0) - sum(shares.values()))
        stages[stage] = {**summary.as_dict(), "parts": shares}
    edges = {
        edge_name(src, dst, kind): {"kind": kind, **summarize(times).as_dict()}
        for (src, dst, kind), times in sorted(edge_times.items())
    }
    return {"source": "trace_store", "requests": len(grouped), "stages": stages, "edges": edges}


def from_metrics(text: str) -> dict[str, Any]:
    """p50 / p99 per stage and edge from a ``/metrics`` scrape (the profiler's window)."""
    stages: dict[str, dict[str, Any]] = {}
    edges: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("omnictl_stage_latency_seconds", "omnictl_edge_latency_seconds"):
            continue
        for sample in family.samples:
            labels = dict(sample.labels)
            quantile = labels.pop("quantile", None)
            if "stage" in labels:
                entry = stages.setdefault(labels["stage"], {})
            else:
                kind = "stream" if labels.get("kind") == "stream" else "hop"
                entry = edges.setdefault(edge_name(labels["src"], labels["dst"], kind), {"kind": kind})
            if sample.name.endswith("_count"):
                entry["count"] = int(sample.value)
            elif quantile is not None:
                entry[{"0.5": "p50", "0.99": "p99"}.get(quantile, f"q{quantile}")] = sample.value

    def measured(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {name: e for name, e in entries.items() if "p50" in e or "p99" in e}

    return {"source": "metrics", "stages": measured(stages), "edges": measured(edges)}
