"""The caller's span from a W3C ``traceparent`` header, parsed by the SDK's propagator.

Parsed in the server's process when the request is submitted, so that what travels with
the request's profiling events is three checked numbers, never a string from the network.
A malformed header is ignored: the request is served and starts a trace of its own.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from omnictl.profiling.events import MetaValue

_PROPAGATOR = TraceContextTextMapPropagator()
# A valid traceparent is 55 characters (version 00); later versions may append fields.
_MAX_LENGTH = 512

# Keys of the ``admitted`` event's meta that carry the caller's span.
TRACE_ID = "trace_id"
PARENT_SPAN_ID = "parent_span_id"
TRACE_FLAGS = "trace_flags"


def parse_traceparent(value: str | None) -> dict[str, MetaValue] | None:
    """``{trace_id, parent_span_id}`` (32 and 16 hex digits) and ``trace_flags``; None when
    ``value`` is absent or not a valid traceparent."""
    if not value or len(value) > _MAX_LENGTH:
        return None
    context = _PROPAGATOR.extract({"traceparent": value})
    parent = trace.get_current_span(context).get_span_context()
    if not parent.is_valid:
        return None
    return {
        TRACE_ID: trace.format_trace_id(parent.trace_id),
        PARENT_SPAN_ID: trace.format_span_id(parent.span_id),
        TRACE_FLAGS: int(parent.trace_flags),
    }
