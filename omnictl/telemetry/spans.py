"""One finished request's profile (its spans by :func:`omnictl.profiling.spans.build_trace`) as OpenTelemetry spans.

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

The spans are the SDK's finished ``ReadableSpan``s, handed to a span processor (the batch
processor, in the export): a tracer's live spans would cost about 15 times as much each
(contexts, locks, attribute checks) and buy nothing for spans whose times are all known.
Whether a request is sampled is the provider's sampler's call, once per request and before
anything is built (by default: the caller's sampled flag, else always;
``OTEL_TRACES_SAMPLER`` changes it).
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from omnictl.profiling.events import Event, EventKind, MetaValue
from omnictl.profiling.spans import RequestTrace, Span, build_trace
from omnictl.telemetry.traceparent import PARENT_SPAN_ID, TRACE_FLAGS, TRACE_ID

ROOT_NAME = "omnictl.request"
SCOPE = InstrumentationScope("omnictl")
_HOP_KINDS = ("hop", "stream")
_STAGE_MARKS = {EventKind.FIRST_EMIT.value}  # a stage's own mark; the rest are the request's
# Span meta keys renamed for attributes (everything is prefixed ``omnictl.``).
_RENAMED = {"src": "source", "dst": "target", "dst_process": "target_process"}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


def emit_trace(
    provider: TracerProvider,
    processor: SpanProcessor,
    request_id: str,
    events: Sequence[Event],
    modalities: Mapping[str, str],
    truncated: int = 0,
) -> int:
    """Hand every span of the request (``events``: its profile) to ``processor`` with
    ``provider``'s resource, when ``provider``'s sampler samples it (decided before any
    span is built); returns how many. ``modalities``: each terminal stage's modality (the
    request records which terminals it expects)."""
    admitted = _first(events, EventKind.ADMITTED)
    admitted_meta = admitted.meta if admitted is not None else {}
    caller = _caller(admitted_meta)
    trace_id = caller.trace_id if caller is not None else random.getrandbits(128)
    decision = provider.sampler.should_sample(
        trace.set_span_in_context(NonRecordingSpan(caller), Context()) if caller is not None else Context(),
        trace_id,
        ROOT_NAME,
        SpanKind.SERVER,
    )
    if not decision.decision.is_sampled():
        return 0
    request = build_trace(request_id, events)
    root_attributes = _root_attributes(request, admitted_meta, modalities, truncated)
    resource = provider.resource
    failure = _first(request.events, EventKind.FAILED)
    error = Status(StatusCode.ERROR, str(failure.meta.get("error", "failed"))) if failure is not None else _UNSET

    def context() -> SpanContext:
        return SpanContext(trace_id, random.getrandbits(64), is_remote=False, trace_flags=_SAMPLED)

    root = context()
    stage_contexts = {span.name: context() for span in request.of_kind("stage")}
    marks: dict[int, list[SpanEvent]] = {c.span_id: [] for c in (root, *stage_contexts.values())}  # by span id
    for mark in request.of_kind("mark"):
        owner = stage_contexts.get(mark.stage or "", root) if mark.name in _STAGE_MARKS else root
        marks[owner.span_id].append(SpanEvent(mark.name, _attributes(mark), mark.start_ns))
    spans = [
        ReadableSpan(
            ROOT_NAME,
            root,
            caller,
            resource,
            root_attributes,
            marks[root.span_id],
            kind=SpanKind.SERVER,
            status=error,
            start_time=request.request.start_ns,
            end_time=request.request.end_ns,
            instrumentation_scope=SCOPE,
        )
    ]
    for span in request.of_kind("stage"):
        own = stage_contexts[span.name]
        status = error if failure is not None and failure.stage == span.stage else _UNSET
        spans.append(
            ReadableSpan(
                f"stage {span.name}",
                own,
                root,
                resource,
                _attributes(span),
                marks[own.span_id],
                status=status,
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=SCOPE,
            )
        )
    for span in request.spans:
        if span.kind in ("stage", "mark"):
            continue
        name = f"{span.kind} {span.name}" if span.kind in _HOP_KINDS else span.name
        spans.append(
            ReadableSpan(
                name,
                context(),
                stage_contexts.get(span.stage or "", root),
                resource,
                _attributes(span),
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=SCOPE,
            )
        )
    for finished in spans:
        processor.on_end(finished)
    return len(spans)


def _caller(admitted: dict[str, MetaValue]) -> SpanContext | None:
    """The caller's span (from its traceparent), or None."""
    trace_id, span_id = admitted.get(TRACE_ID), admitted.get(PARENT_SPAN_ID)
    if not isinstance(trace_id, str) or not isinstance(span_id, str):
        return None
    flags = admitted.get(TRACE_FLAGS)
    return SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(flags if isinstance(flags, int) else TraceFlags.DEFAULT),
    )


def _root_attributes(
    request: RequestTrace, admitted: dict[str, MetaValue], modalities: Mapping[str, str], truncated: int
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
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


def _attributes(span: Span) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"omnictl.process": span.process}
    if span.stage is not None:
        attributes["omnictl.stage"] = span.stage
    for key, value in span.meta.items():
        if value is not None:
            attributes[f"omnictl.{_RENAMED.get(key, key)}"] = value
    return attributes


def _first(events: Sequence[Event], kind: EventKind) -> Event | None:
    return next((e for e in events if e.kind is kind), None)
