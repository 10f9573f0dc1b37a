"""Goodput under an audio SLO, and where each missed request's late audio spent its time.

A request meets the SLO when it completed, its first audio came within ``ttfp_s`` and its
largest underrun stayed within ``underrun_s`` (both from the client's receive clock). For
each request that missed, the profiler's trace says which stage held the late chunk: the
stage (and its part: queue, decode, a named phase...) with the most work in the window
the chunk was awaited, from the previous chunk's arrival (the request's start for a late
first chunk) to its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.bench.stats import RequestRecord

# a stage's own work and waits; hops are credited to the edge they crossed
_WORK = ("fanin_wait", "unpack", "queue", "build", "prefill", "decode", "compute")


@dataclass(frozen=True)
class AudioSlo:
    ttfp_s: float | None = None
    underrun_s: float | None = None

    @property
    def set(self) -> bool:
        return self.ttfp_s is not None or self.underrun_s is not None

    def missed(self, record: RequestRecord) -> str | None:
        """Why ``record`` misses the SLO (``failed``, ``ttfp``, ``underrun``), None when it meets it."""
        if not record.ok:
            return "failed"
        if self.ttfp_s is not None and (record.ttfa is None or record.ttfa > self.ttfp_s):
            return "ttfp"
        largest = record.largest_underrun
        if self.underrun_s is not None and largest is not None and largest > self.underrun_s:
            return "underrun"
        return None


@dataclass(frozen=True)
class Miss:
    request_id: str | None
    reason: str  # ttfp or underrun (a failed request has no late chunk to place)
    window: tuple[float, float]  # client seconds: awaited from .. arrived
    ttfa: float | None  # the client's first audio: aligns its clock with the trace's


def late_window(record: RequestRecord, reason: str) -> tuple[float, float] | None:
    """When the late chunk was awaited, in the client's seconds since the request was sent."""
    if reason == "ttfp":
        return (0.0, record.ttfa if record.ttfa is not None else record.e2e or 0.0)
    report = record.continuity()
    if not report.underruns:
        return None
    worst = max(report.underruns, key=lambda u: u.seconds)
    arrived = record.audio_chunks[worst.chunk][0]
    return (record.audio_chunks[worst.chunk - 1][0], arrived)


def judge(records: list[RequestRecord], slo: AudioSlo, duration: float) -> tuple[dict[str, Any], list[Miss]]:
    met = 0
    misses: list[Miss] = []
    reasons: dict[str, int] = defaultdict(int)
    for record in records:
        if record.overloaded:  # refused at once: not served, so counted as missed
            reasons["refused"] += 1
            continue
        reason = slo.missed(record)
        if reason is None:
            met += 1
            continue
        reasons[reason] += 1
        window = late_window(record, reason) if reason != "failed" else None
        if window is not None:
            misses.append(Miss(record.request_id, reason, window, record.ttfa))
    summary = {
        "ttfp_s": slo.ttfp_s,
        "underrun_s": slo.underrun_s,
        "met": met,
        "share": met / len(records) if records else 0.0,
        "goodput_per_s": met / duration if duration > 0 else 0.0,
        "missed_by": dict(reasons),
    }
    return summary, misses


def where_late(run_dir: Path, misses: list[Miss], wait_s: float = 5.0) -> list[dict[str, Any]]:
    """Each miss with the stage its late chunk spent the most time at (None without a trace)."""
    from omnictl.bench.breakdown import gather
    from omnictl.profiling.store import TraceStore

    wanted = {m.request_id for m in misses if m.request_id}
    grouped = gather(TraceStore(run_dir), wanted, wait_s) if wanted else {}
    return [{**_as_dict(miss), **_place(miss, grouped.get(miss.request_id or "", []))} for miss in misses]


def _as_dict(miss: Miss) -> dict[str, Any]:
    return {"request_id": miss.request_id, "reason": miss.reason, "window_s": list(miss.window)}


def _place(miss: Miss, events: list[Any]) -> dict[str, Any]:
    from omnictl.profiling.spans import build_trace

    if not events or miss.request_id is None:
        return {"stage": None, "part": None, "seconds": None}
    trace = build_trace(miss.request_id, events)
    # Align the client's clock on the server's: the first audio mark is the client's first
    # audio chunk leaving (less the network's few microseconds on one host).
    origin = trace.request.start_ns
    first_audio = next((s for s in trace.of_kind("mark") if s.name == "first_audio"), None)
    if first_audio is not None and miss.ttfa is not None:
        origin = first_audio.start_ns - int(miss.ttfa * 1e9)
    lo, hi = origin + int(miss.window[0] * 1e9), origin + int(miss.window[1] * 1e9)
    time_at: dict[tuple[str, str], int] = defaultdict(int)
    for span in trace.spans:
        overlap = min(hi, span.end_ns) - max(lo, span.start_ns)
        if overlap <= 0:
            continue
        if span.kind in _WORK and span.stage:
            time_at[(span.stage, span.name)] += overlap
        elif span.kind in ("hop", "stream") and span.meta.get("received") is not False:
            time_at[(f"{span.meta['src']}->{span.meta['dst']}", span.kind)] += overlap
    if not time_at:
        return {"stage": None, "part": None, "seconds": None}
    per_stage: dict[str, int] = defaultdict(int)
    for (stage, _), ns in time_at.items():
        per_stage[stage] += ns
    stage = max(per_stage, key=lambda s: per_stage[s])
    part = max((p for s, p in time_at if s == stage), key=lambda p: time_at[(stage, p)])
    return {"stage": stage, "part": part, "seconds": time_at[(stage, part)] / 1e9}
