"""One finished request's trace (:func:`omnictl.profiling.spans.build_trace`) as OpenTelemetry spans.

The spans are made after the fact with the times the profiler recorded, so an OTLP viewer
shows the same timeline as ``omnictl trace``::

    omnictl.request                       request id, outcome, modalities (a child of the
    │                                     caller's span when the request had a traceparent)
    ├── stage prep                        one per stage the request ran in
    │   ├── queue / fanin_wait / unpack   waiting at the stage
    │   ├── build / prefill / decode      the scheduler's compute, and phases it names
    │   └── hop prep → answer             sent → received: transport, bytes (stream chunks too)
    └── stage answer ...

Marks (first text, first audio, a terminal's completion, the failure) are span events: on
the root, or on their stage's span for a stage's own first emit.
"""

from __future__ import annotations

from typing import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer

from omnictl.profiling.events import Event, EventKind, MetaValue
from omnictl.profiling.spans import RequestTrace, Span
from omnictl.telemetry.traceparent import PARENT_SPAN_ID, TRACE_FLAGS, TRACE_ID

ROOT_NAME = "omnictl.request"
_HOP_KINDS = ("hop", "stream")
_STAGE_MARKS = {EventKind.FIRST_EMIT.value}  # a stage's own mark; the rest are the request's
# Span meta keys renamed for attributes (everything is prefixed ``omnictl.``).
_RENAMED = {"src": "source", "dst": "target", "dst_process": "target_process"}


def emit_trace(tracer: Tracer, request: RequestTrace, modalities: Mapping[str, str], truncated: int = 0) -> None:
    """Create and end every span of ``request`` on ``tracer`` (its processor exports them).
    ``modalities``: each terminal stage's modality (the request records which terminals it expects)."""
    admitted = next((e for e in request.events if e.kind is EventKind.ADMITTED), None)
    admitted_meta = admitted.meta if admitted is not None else {}
    root = tracer.start_span(
        ROOT_NAME, context=_caller(admitted_meta), kind=SpanKind.SERVER,
        attributes=_root_attributes(request, admitted_meta, modalities, truncated), start_time=request.request.start_ns,
    )
    failure = _first(request.events, EventKind.FAILED)
    if failure is not None:
        root.set_status(Status(StatusCode.ERROR, str(failure.meta.get("error", "failed"))))
    root_context = trace.set_span_in_context(root, Context())
    stage_spans: dict[str, trace.Span] = {}
    for span in request.of_kind("stage"):
        stage_span = tracer.start_span(f"stage {span.name}", context=root_context,
                                       attributes=_attributes(span), start_time=span.start_ns)
        if failure is not None and failure.stage == span.stage:
            stage_span.set_status(Status(StatusCode.ERROR, str(failure.meta.get("error", "failed"))))
        stage_spans[span.name] = stage_span
    for span in request.spans:
        if span.kind in ("stage", "mark"):
            continue
        parent = stage_spans.get(span.stage or "", root)
        name = f"{span.kind} {span.name}" if span.kind in _HOP_KINDS else span.name
        child = tracer.start_span(name, context=trace.set_span_in_context(parent, Context()),
                                  attributes=_attributes(span), start_time=span.start_ns)
        child.end(end_time=span.end_ns)
    for mark in request.of_kind("mark"):
        owner = stage_spans.get(mark.stage or "", root) if mark.name in _STAGE_MARKS else root
        owner.add_event(mark.name, attributes=_attributes(mark), timestamp=mark.start_ns)
    for span in request.of_kind("stage"):
        stage_spans[span.name].end(end_time=span.end_ns)
    root.end(end_time=request.request.end_ns)


def _caller(admitted: dict[str, MetaValue]) -> Context:
    """The caller's span (from its traceparent) as the parent context; else a new trace."""
    trace_id, span_id = admitted.get(TRACE_ID), admitted.get(PARENT_SPAN_ID)
    if not isinstance(trace_id, str) or not isinstance(span_id, str):
        return Context()
    flags = admitted.get(TRACE_FLAGS)
    caller = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                         trace_flags=TraceFlags(flags if isinstance(flags, int) else TraceFlags.DEFAULT))
    return trace.set_span_in_context(NonRecordingSpan(caller), Context())


def _root_attributes(request: RequestTrace, admitted: dict[str, MetaValue], modalities: Mapping[str, str],
                     truncated: int) -> dict[str, object]:
    attributes: dict[str, object] = {
        "omnictl.request_id": request.request_id,
        "omnictl.outcome": request.status,
        "omnictl.stages": request.stages,
    }
    terminals = admitted.get("terminals")
    if isinstance(terminals, str):
        expected = [name for name in terminals.split(",") if name]
        attributes["omnictl.terminals"] = expected
        attributes["omnictl.modalities"] = sorted({modalities[t] for t in expected if t in modalities})
    failure = _first(request.events, EventKind.FAILED)
    if failure is not None:
        attributes["omnictl.error"] = str(failure.meta.get("error", ""))
        if failure.stage is not None:
            attributes["omnictl.failed_stage"] = failure.stage
    if truncated:
        attributes["omnictl.events_dropped"] = truncated
    return attributes


def _attributes(span: Span) -> dict[str, object]:
    attributes: dict[str, object] = {"omnictl.process": span.process}
    if span.stage is not None:
        attributes["omnictl.stage"] = span.stage
    for key, value in span.meta.items():
        if value is not None:
            attributes[f"omnictl.{_RENAMED.get(key, key)}"] = value
    return attributes


def _first(events: list[Event], kind: EventKind) -> Event | None:
    return next((e for e in events if e.kind is kind), None)
