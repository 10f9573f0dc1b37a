"""The OTLP/HTTP export: the profiling collector's hook when ``--otlp-endpoint`` is set.

The collector hands every batch of events to :meth:`OtlpSink.add` and calls
:meth:`OtlpSink.tick` between batches; a request's spans are built once its events are
complete (see :mod:`omnictl.telemetry.pending`) and exported by the SDK's
``BatchSpanProcessor`` on a thread of its own, so a slow or unreachable collector never
holds up the collector's loop (its queue is bounded: spans beyond it are dropped).
:meth:`OtlpSink.close` exports what has ended and flushes, within a bounded time.

An endpoint that cannot be reached is logged once (and once more when it answers again),
not once per batch: the exporter's own per-batch records are kept for that one warning.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterable, Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from omnictl.profiling.events import Event
from omnictl.profiling.spans import build_trace
from omnictl.telemetry.endpoint import OtlpTarget
from omnictl.telemetry.pending import Finished, PendingTraces
from omnictl.telemetry.spans import emit_trace

logger = logging.getLogger(__name__)

EXPORT_TIMEOUT_S = 3.0  # one batch to the collector, retries included
SCHEDULE_DELAY_MS = 1000  # how often the processor sends a batch
# Flushing at shutdown: batches not sent by then are dropped, and a retry still waiting is
# cut short; with one POST's timeout, well inside the collector process's 5 s stop deadline.
SHUTDOWN_S = 1.5
# The exporter logs every failed batch (and every retry) on these loggers.
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.common.http")


class _Reasons(logging.Filter):
    """Keeps the exporter's per-batch failure records off the log; remembers the first one
    since :meth:`clear` (the cause: its last one only says the retries ran out)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ""

    def clear(self) -> None:
        self.first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        self.first = self.first or record.getMessage()
        return False


class WarnOnceExporter(SpanExporter):
    """Wraps an exporter: the first failure of an outage is one warning, its end one info line."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.failing = False
        self.failures = 0  # batches that could not be exported
        self._stop_at: float | None = None  # monotonic; batches after it are dropped unsent
        self._shut = False
        self._shut_lock = threading.Lock()  # the processor and the shutdown timer may both call shutdown
        self._reason = _Reasons()
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._reason)

    def stop_at(self, deadline: float) -> None:
        """Shutting down: from ``deadline`` on, batches are dropped instead of sent."""
        self._stop_at = deadline

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stop_at is not None and (self.failing or time.monotonic() >= self._stop_at):
            self.failures += 1
            return SpanExportResult.FAILURE  # shutting down: no new attempt at a failing or late export
        self._reason.clear()
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            if self.failing:
                logger.info("OpenTelemetry: exporting traces to %s again", self.endpoint)
            self.failing = False
            return result
        self.failures += 1
        if not self.failing:
            self.failing = True
            logger.warning("OpenTelemetry: cannot export traces to %s (%s); spans are dropped until it answers "
                           "(not logged again meanwhile)", self.endpoint, self._reason.first or "export failed")
        return result

    def shutdown(self) -> None:
        with self._shut_lock:
            if self._shut:
                return
            self._shut = True
        self.inner.shutdown()  # also cuts short a retry's wait
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self._reason)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def resource(model: str) -> Resource:
    """``service.name`` omnictl (unless ``OTEL_SERVICE_NAME`` says otherwise) and the served model."""
    attributes = {"omnictl.model": model}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "omnictl"
    return Resource.create(attributes)


class OtlpSink:
    """Turns finished requests' events into exported traces. Not thread-safe: one caller."""

    def __init__(self, target: OtlpTarget, exporter: SpanExporter | None = None,
                 pending: PendingTraces | None = None) -> None:
        self.target = target
        inner = exporter if exporter is not None else OTLPSpanExporter(endpoint=target.url, timeout=EXPORT_TIMEOUT_S)
        self.exporter = WarnOnceExporter(inner, target.url)
        self.pending = pending if pending is not None else PendingTraces()  # (an empty one is falsy)
        self.exported = 0  # requests whose spans were handed to the processor
        # A provider of our own, not the global one: a program embedding omnictl keeps its own.
        self._provider = TracerProvider(resource=resource(target.model))
        self._processor = BatchSpanProcessor(self.exporter, schedule_delay_millis=SCHEDULE_DELAY_MS)
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("omnictl")

    def add(self, events: Iterable[Event]) -> None:
        self.pending.add(events)

    def tick(self) -> None:
        """Build and queue the traces of the requests whose events are complete."""
        for finished in self.pending.take_due():
            self._emit(finished)

    def close(self) -> None:
        """Queue every request that has ended, flush, stop: within about SHUTDOWN_S plus one
        export's timeout, however the collector answers."""
        for finished in self.pending.take_ended():
            self._emit(finished)
        self.exporter.stop_at(time.monotonic() + SHUTDOWN_S)
        cut_short = threading.Timer(SHUTDOWN_S, self.exporter.shutdown)  # a retry waiting past the deadline
        cut_short.daemon = True
        cut_short.start()
        try:
            self._processor.shutdown()  # exports what is queued, then shuts the exporter down
        finally:
            cut_short.cancel()

    def _emit(self, finished: Finished) -> None:
        emit_trace(self._tracer, build_trace(finished.request_id, finished.events), self.target.modalities,
                   finished.truncated)
        self.exported += 1
