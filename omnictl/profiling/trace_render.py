"""One request as text (a waterfall on one time axis) or as JSON (events and spans).

The waterfall has one row per stage; each row paints the stage's segments in its own
character, so it reads without colour too::

    request        |-----------------T-----------A----|  38.0 ms
    preprocessing  |>::bb---                          |  3.35 ms
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from rich.text import Text

from omnictl.profiling.events import EventKind
from omnictl.profiling.spans import RequestTrace, Span
from omnictl.profiling.units import format_bytes, format_seconds

NAME_WIDTH = 14
TIME_WIDTH = 9

# Segment kind -> (character, style); later entries paint over earlier ones.
SEGMENTS: dict[str, tuple[str, str]] = {
    "stage": ("-", "dim"),
    "fanin_wait": ("~", "yellow"),
    "unpack": ("u", "magenta"),
    "queue": (":", "red"),
    "build": ("b", "cyan"),
    "prefill": ("P", "blue"),
    "decode": ("=", "green"),
    "compute": ("#", "bold green"),  # a phase the scheduler named (its name is listed below)
}
ARRIVAL = (">", "bold magenta")  # a hop (or the first stream chunk) arrived at this stage
UNDERRUN = ("!", "bold red")  # the listener's audio had run out: waiting for the next chunk
# A realtime turn's milestones (omnictl.serving.realtime.session.milestones), in their order.
MILESTONE_MARKS = {
    "preempted": ("E", "bold cyan"),  # an early (preemptive) answer started at a pause
    "speech_stopped": ("S", "bold cyan"),
    "turn_confirmed": ("C", "bold cyan"),
    "transcript_final": ("W", "bold magenta"),
    "response_started": ("R", "bold blue"),
    "first_token": ("T", "bold green"),
    "first_clause": ("K", "bold green"),
    "first_audio_sent": ("A", "bold yellow"),
    "preemptive_dropped": ("D", "bold red"),
}
MARKS = {"first_text": ("T", "bold green"), "first_audio": ("A", "bold yellow"), "failed": ("X", "bold red")}
LEGEND = (
    "legend: > hop arrival  u unpack  ~ fan-in wait  : queue  b build  P prefill",
    "        = decode  # named phase  - other time at stage  T first text",
    "        A first audio  X failed  ! underrun (the listener waits for audio)",
)


def render_waterfall(
    trace: RequestTrace,
    width: int = 80,
    nodes: dict[str, str | None] | None = None,
    groups: dict[str, str] | None = None,
) -> Text:
    """The request's waterfall, hops and marks; no line is wider than ``width``. ``nodes``
    (stage -> `node` label, from the run's description): a line saying where each stage ran.
    ``groups`` (stage -> where its ranks ran, for tensor-parallel stages): a line naming
    them; a group is one row, since only its rank 0 records events."""
    bar_width = max(10, width - NAME_WIDTH - TIME_WIDTH - 3)
    axis = _Axis(trace.request.start_ns, trace.request.end_ns, bar_width)
    out = Text(no_wrap=True, overflow="crop")
    total = format_seconds(trace.request.duration_ns / 1e9)
    title = f"turn {trace.request_id}" if trace.status == "turn" else f"request {trace.request_id}  {trace.status}"
    out.append(_fit(f"{title}  {total}", width) + "\n", style="bold")
    out.append(" " * (NAME_WIDTH + 1) + _axis_labels(total, bar_width + 2) + "\n", style="dim")
    if trace.status == "turn":
        return _turn(out, trace, axis, width)
    out.append_text(_request_row(trace, axis))
    for stage in trace.stages:
        out.append_text(_stage_row(trace, stage, axis))
    out.append_text(_marks_line(trace, width))
    out.append_text(_underruns_line(trace, width))
    out.append_text(_dropped_line(trace, width))
    if nodes and any(label is not None for label in nodes.values()):
        placed = [f"{stage} on {nodes.get(stage) or '-'}" for stage in trace.stages]  # -: the coordinator's machine
        out.append(_fit("nodes: " + "; ".join(placed), width) + "\n")
    reached = [f"{stage} on {groups[stage]}" for stage in trace.stages if groups and stage in groups]
    if reached:
        out.append(_fit("tensor-parallel groups (one row each): " + "; ".join(reached), width) + "\n")
    out.append_text(_phases_line(trace, width))
    out.append_text(_hops_table(trace, width))
    for line in LEGEND:
        out.append(_fit(line, width) + "\n", style="dim")
    out.rstrip()
    return out


def _turn(out: Text, trace: RequestTrace, axis: _Axis, width: int) -> Text:
    """A realtime turn: its milestones on the axis, then each with its time and request."""
    cells = [(" ", "")] * axis.width
    lines = []
    for span in trace.of_kind("milestone"):
        char, style = MILESTONE_MARKS.get(span.name, ("?", "bold"))
        cells[axis.column(span.start_ns)] = (char, style)
        request = span.meta.get("request")
        at = format_seconds((span.start_ns - trace.request.start_ns) / 1e9)
        lines.append(f"  {char} {span.name.replace('_', ' ')} +{at}" + (f"  ({request})" if request else ""))
    out.append_text(_row("turn", cells, format_seconds(trace.request.duration_ns / 1e9)))
    out.append("milestones (from the end of speech; the pipeline request each came from):\n")
    for line in lines:
        out.append(_fit(line, width) + "\n")
    out.rstrip()
    return out


def _stage_row(trace: RequestTrace, stage: str, axis: _Axis) -> Text:
    cells = [(" ", "")] * axis.width
    spans = [s for s in trace.spans if s.stage == stage]
    for kind, (char, style) in SEGMENTS.items():
        for span in spans:
            if span.kind == kind:
                for column in axis.columns(span.start_ns, span.end_ns):
                    cells[column] = (char, style)
        if kind == "stage":  # arrivals go under the segments, over the plain stage time
            for span in trace.of_kind("hop", "stream"):
                if span.meta.get("dst") == stage and span.meta.get("received", True):
                    cells[axis.column(span.end_ns)] = ARRIVAL
    stage_spans = [s for s in spans if s.kind == "stage"]
    busy = sum(s.duration_ns for s in stage_spans) / 1e9 if stage_spans else None
    return _row(stage, cells, format_seconds(busy))


def _request_row(trace: RequestTrace, axis: _Axis) -> Text:
    cells = [("-", "bold")] * axis.width
    for span in trace.of_kind("mark"):
        if span.name in MARKS:
            cells[axis.column(span.start_ns)] = MARKS[span.name]
    for span in trace.of_kind("underrun"):
        for column in axis.columns(span.start_ns, span.end_ns):
            cells[column] = UNDERRUN
    return _row("request", cells, format_seconds(trace.request.duration_ns / 1e9))


def _row(name: str, cells: list[tuple[str, str]], figure: str) -> Text:
    row = Text(f"{_fit(name, NAME_WIDTH):<{NAME_WIDTH}} |", no_wrap=True)
    for char, style in cells:
        row.append(char, style=style or None)
    row.append(f"|{figure:>{TIME_WIDTH}}\n")
    return row


def _marks_line(trace: RequestTrace, width: int) -> Text:
    parts = []
    for span in trace.of_kind("mark"):
        if span.name in MARKS:
            where = f" at {span.stage}" if span.stage else ""
            parts.append(
                f"{span.name.replace('_', ' ')}{where} +{format_seconds((span.start_ns - trace.request.start_ns) / 1e9)}"
            )
    return Text(_fit("marks: " + ("; ".join(parts) or "none"), width) + "\n")


def _underruns_line(trace: RequestTrace, width: int) -> Text:
    """Each underrun: when the audio ran out, how long the listener waited, which chunk."""
    gaps = trace.of_kind("underrun")
    if not gaps:
        return Text("")
    parts = [
        f"+{format_seconds((s.start_ns - trace.request.start_ns) / 1e9)} waited "
        f"{format_seconds(s.duration_ns / 1e9)} (chunk {s.meta.get('chunk', '?')})"
        for s in gaps
    ]
    total = format_seconds(sum(s.duration_ns for s in gaps) / 1e9)
    return Text(_fit(f"underruns (!): {len(gaps)}, {total} in all: " + "; ".join(parts), width) + "\n")


def _dropped_line(trace: RequestTrace, width: int) -> Text:
    """What the trace store dropped of this request past its share (its notes' counts add up)."""
    notes = [e for e in trace.events if e.kind is EventKind.DROPPED]
    if not notes:
        return Text("")
    count = sum(int(e.meta.get("count") or 0) for e in notes)
    share = format_bytes(int(notes[0].meta.get("share_bytes") or 0))
    line = (
        f"trace cut: {count} events of this request were not stored (its share of the trace store, {share}, was full)"
    )
    return Text(_fit(line, width) + "\n", style="bold red")


def _phases_line(trace: RequestTrace, width: int) -> Text:
    """The phases schedulers named (painted ``#``), with their total time per stage."""
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for span in trace.of_kind("compute"):
        totals[(span.name, span.stage or "?")] += span.duration_ns
    if not totals:
        return Text("")
    parts = [f"{name} at {stage} {format_seconds(ns / 1e9)}" for (name, stage), ns in totals.items()]
    return Text(_fit("phases (#): " + "; ".join(parts), width) + "\n")


def _hops_table(trace: RequestTrace, width: int) -> Text:
    """One line per edge: data hops one by one, stream chunks summarised; columns sized to
    their widest cell, so they line up whatever the names and figures."""
    groups: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for span in trace.of_kind("hop", "stream"):
        groups[(span.kind, span.name)].append(span)
    out = Text("hops:\n" if groups else "hops: none recorded\n")
    rows = []
    for (kind, name), spans in groups.items():
        latencies = sorted(s.duration_ns for s in spans if s.meta.get("received", True))
        transport = str(spans[0].meta.get("transport", "?"))
        sizes = [s.meta["bytes"] for s in spans if isinstance(s.meta.get("bytes"), (int, float))]
        size = format_bytes(sum(sizes)) if sizes else "-"  # type: ignore[arg-type]  # numbers only (filtered above); the list is typed by the meta values, which may be str
        if not latencies:
            latency = "not received"
        elif kind == "stream":
            latency = f"{len(spans)} chunks, max {format_seconds(latencies[-1] / 1e9)}"
        else:
            latency = format_seconds(latencies[0] / 1e9)
        label = f"{name} ({kind})" if kind == "stream" else name
        rows.append((label, transport, latency, size))
    if not rows:
        return out
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    # Figures keep their full width; only the edge label gives way on a narrow screen.
    widths[0] = max(8, min(widths[0], width - 2 - sum(widths[1:]) - 3))
    for label, transport, latency, size in rows:
        line = f"  {_fit(label, widths[0]):<{widths[0]}} {transport:<{widths[1]}} {latency:>{widths[2]}} {size:>{widths[3]}}"
        out.append(line + "\n")
    return out


class _Axis:
    def __init__(self, start_ns: int, end_ns: int, width: int) -> None:
        self.start, self.width = start_ns, width
        self.scale = width / max(1, end_ns - start_ns)

    def column(self, ts: int) -> int:
        return min(self.width - 1, max(0, int((ts - self.start) * self.scale)))

    def columns(self, start_ns: int, end_ns: int) -> range:
        first = self.column(start_ns)
        last = min(self.width, math.ceil((end_ns - self.start) * self.scale))
        # Anything that lasted at all shows as at least one column.
        return range(first, max(first + 1, last))


def _axis_labels(total: str, width: int) -> str:
    return "0" + total.rjust(width - 1)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def trace_to_json(trace: RequestTrace) -> dict[str, Any]:
    """The request's events and the spans derived from them, as plain JSON types."""
    return {
        "request_id": trace.request_id,
        "status": trace.status,
        "start_ns": trace.request.start_ns,
        "end_ns": trace.request.end_ns,
        "duration_ns": trace.request.duration_ns,
        "stages": trace.stages,
        "events": [
            {"kind": e.kind.value, "stage": e.stage, "process": e.process, "ts": e.ts, "meta": dict(e.meta)}
            for e in trace.events
        ],
        "spans": [_span_json(span) for span in [trace.request, *trace.spans]],
    }


def _span_json(span: Span) -> dict[str, Any]:
    return {
        "name": span.name,
        "kind": span.kind,
        "stage": span.stage,
        "process": span.process,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "duration_ns": span.duration_ns,
        "meta": dict(span.meta),
    }
