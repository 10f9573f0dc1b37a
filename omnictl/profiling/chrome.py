"""Export one request as Chrome trace-event JSON (loads in Perfetto and chrome://tracing).

Layout: one pid per process, one tid per stage (the coordinator's request span gets a
``request`` track of its own); a complete (``X``) event per span; each hop is an ``X``
event on a track per edge in the receiving process plus a flow (``s`` at the sender's
stage, ``f`` at the receiver's) so the viewer draws an arrow; marks are instant events;
``M`` metadata events name every process and thread. Times are microseconds from the
request's admission.
"""

from __future__ import annotations

from typing import Any, Callable

from omnictl.profiling.spans import RequestTrace, Span

REQUEST_TRACK = "request"
_HOP_KINDS = ("hop", "stream")


class _Ids:
    """Stable small integers for processes and the tracks inside them."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], int] = {}

    def pid(self, process: str) -> int:
        return self.pids.setdefault(process, len(self.pids) + 1)

    def tid(self, process: str, track: str) -> int:
        self.pid(process)
        return self.tids.setdefault((process, track), len(self.tids) + 1)


def to_chrome(trace: RequestTrace) -> dict[str, Any]:
    t0 = trace.request.start_ns
    ids = _Ids()
    events: list[dict[str, Any]] = []

    def us(ns: int) -> float:
        return (ns - t0) / 1000

    def track_of(span: Span) -> tuple[int, int]:
        # Marks the coordinator records about a stage go on the coordinator's own track.
        stage = span.stage
        own = stage is not None and trace.stage_process.get(stage) == span.process
        return ids.pid(span.process), ids.tid(span.process, stage if own and stage is not None else REQUEST_TRACK)

    def complete(span: Span, pid: int, tid: int, name: str) -> None:
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": span.kind,
                "pid": pid,
                "tid": tid,
                "ts": us(span.start_ns),
                "dur": span.duration_ns / 1000,
                "args": dict(span.meta),
            }
        )

    request = trace.request
    complete(request, *track_of(request), f"request {trace.request_id}")
    for stage in trace.stages:  # tracks in waterfall order
        ids.tid(trace.stage_process[stage], stage)
    flow_id = 0
    for span in trace.spans:
        if span.kind == "mark":
            pid, tid = track_of(span)
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": span.name,
                    "cat": "mark",
                    "pid": pid,
                    "tid": tid,
                    "ts": us(span.start_ns),
                    "args": dict(span.meta),
                }
            )
        elif span.kind in _HOP_KINDS:
            if span.meta.get("received", True) is False:
                continue  # never arrived: nothing to draw an arrow to
            flow_id += 1
            events.extend(_hop_events(span, flow_id, ids, us))
        else:
            name = span.name if span.kind == "stage" else span.kind
            complete(span, *track_of(span), name)
    events.extend(_metadata(ids))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"request_id": trace.request_id, "status": trace.status, "start_ns": t0},
    }


def _hop_events(span: Span, flow_id: int, ids: _Ids, us: Callable[[int], float]) -> list[dict[str, Any]]:
    src_pid, src_tid = ids.pid(span.process), ids.tid(span.process, span.stage or REQUEST_TRACK)
    dst_process, dst = str(span.meta.get("dst_process", span.process)), str(span.meta.get("dst"))
    dst_pid, dst_tid = ids.pid(dst_process), ids.tid(dst_process, dst)
    edge_tid = ids.tid(dst_process, f"{span.kind}s {span.name}")
    common = {"name": span.name, "cat": span.kind, "id": flow_id}
    return [
        {
            "ph": "X",
            "name": span.name,
            "cat": span.kind,
            "pid": dst_pid,
            "tid": edge_tid,
            "ts": us(span.start_ns),
            "dur": span.duration_ns / 1000,
            "args": dict(span.meta),
        },
        {**common, "ph": "s", "pid": src_pid, "tid": src_tid, "ts": us(span.start_ns)},
        {**common, "ph": "f", "bp": "e", "pid": dst_pid, "tid": dst_tid, "ts": us(span.end_ns)},
    ]


def _metadata(ids: _Ids) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for process, pid in ids.pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for (process, track), tid in ids.tids.items():
        pid = ids.pids[process]
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events
