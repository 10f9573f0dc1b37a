"""The OTLP/HTTP export: the profiling collector's hook when ``--otlp-endpoint`` is set.

The collector hands every batch of events to :meth:`OtlpSink.add` and calls
:meth:`OtlpSink.tick` between batches; once a request's events are complete (see
:mod:`omnictl.telemetry.pending`) a builder thread makes its spans, and the SDK's
``BatchSpanProcessor`` exports them from a thread of its own: neither building nor a slow
or unreachable collector holds up the collector's loop. Both queues are bounded; what
does not fit is dropped. :meth:`OtlpSink.close` exports what has ended and flushes, within
a bounded time.

An endpoint that cannot be reached is logged once (and once more when it answers again),
not once per batch: the exporter's own per-batch records are kept for that one warning.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Iterable, Sequence

import msgspec
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from omnictl.profiling.events import Event
from omnictl.telemetry.endpoint import OtlpTarget
from omnictl.telemetry.pending import Finished, PendingTraces
from omnictl.telemetry.spans import emit_trace

logger = logging.getLogger(__name__)

EXPORT_TIMEOUT_S = 2.0  # one batch to the collector, retries included
SCHEDULE_DELAY_MS = 1000  # how often the processor sends a batch (sooner when a batch is full)
EXPORT_BATCH_SPANS = 1024  # spans per POST
MAX_QUEUED_SPANS = 16_384  # spans waiting for export (a few MB): more are dropped
MAX_BACKLOG = 1000  # finished requests waiting for their spans to be built: more are dropped
# At shutdown: building what has ended, then flushing (batches not sent by then are dropped,
# and a retry still waiting is cut short); with one POST's timeout, inside the collector
# process's 5 s stop deadline.
BUILD_S = 1.0
SHUTDOWN_S = 1.5
# The exporter logs every failed batch (and every retry) on these loggers...
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.common.http")
# ...and the batch processor each span it drops while its queue is full (the endpoint is down).
_PROCESSOR_LOGGER = "opentelemetry.sdk._shared_internal"


class _QueueFull(logging.Filter):
    """Keeps the batch processor's "queue full" records off the log, and warns once when the
    endpoint answers (so the export itself is too slow): while it does not, its own warning
    says why spans are dropped. (The SDK logs only some of the drops; they are counted in
    :attr:`OtlpSink.summary`.)"""

    def __init__(self, exporter: WarnOnceExporter) -> None:
        super().__init__()
        self.exporter = exporter
        self.warned = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "full" in record.getMessage() and not self.warned:
            self.warned = True
            if not self.exporter.failing:
                logger.warning(
                    "OpenTelemetry: spans come faster than %s takes them: the export queue (%d spans) "
                    "is full and spans are dropped (not logged again)",
                    self.exporter.endpoint,
                    MAX_QUEUED_SPANS,
                )
        return False


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
        self.offered = 0  # spans the processor handed over (the rest were dropped from its queue)
        self._stop_at: float | None = None  # monotonic; batches after it are dropped unsent
        self._shut = False
        self._shut_lock = threading.Lock()  # the processor and the shutdown timer may both call shutdown
        self._reason = _Reasons()
        self.queue_full = _QueueFull(self)  # the processor's: kept apart, so they never pass for the cause
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._reason)
        logging.getLogger(_PROCESSOR_LOGGER).addFilter(self.queue_full)

    def stop_at(self, deadline: float) -> None:
        """Shutting down: from ``deadline`` on, batches are dropped instead of sent."""
        self._stop_at = deadline

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.offered += len(spans)
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
            logger.warning(
                "OpenTelemetry: cannot export traces to %s (%s); spans are dropped until it answers "
                "(not logged again meanwhile)",
                self.endpoint,
                self._reason.first or "export failed",
            )
        return result

    def shutdown(self) -> None:
        with self._shut_lock:
            if self._shut:
                return
            self._shut = True
        self.inner.shutdown()  # also cuts short a retry's wait

    def stop_filtering(self) -> None:
        """Once the processor's thread is done: the exporter's loggers are left as they were."""
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self._reason)
        logging.getLogger(_PROCESSOR_LOGGER).removeFilter(self.queue_full)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def resource(model: str) -> Resource:
    """``service.name`` omnictl (unless ``OTEL_SERVICE_NAME`` says otherwise) and the served model."""
    attributes = {"omnictl.model": model}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "omnictl"
    return Resource.create(attributes)


class OtlpSink:
    """Turns finished requests' events into exported traces.

    ``add`` and ``tick`` come from the collector's loop and cost it little: a finished
    request is handed to a builder thread through a bounded backlog, so building spans
    never holds up receiving events; when
    requests finish faster than their spans can be built, the newest are dropped, counted
    (:meth:`summary`) and warned about once.
    """

    def __init__(
        self,
        target: OtlpTarget,
        exporter: SpanExporter | None = None,
        pending: PendingTraces | None = None,
        backlog: int = MAX_BACKLOG,
    ) -> None:
        self.target = target
        inner = exporter if exporter is not None else OTLPSpanExporter(endpoint=target.url, timeout=EXPORT_TIMEOUT_S)
        self.exporter = WarnOnceExporter(inner, target.url)
        self.pending = pending if pending is not None else PendingTraces()  # (an empty one is falsy)
        # Each counter has one writer: handed and dropped the collector's loop, built and
        # spans the builder thread.
        self.handed = 0  # finished requests queued for the builder
        self.dropped = 0  # finished requests not queued: the backlog was full
        self.built = 0  # requests whose spans were made and handed to the processor
        self.spans = 0  # spans made
        # A provider of our own, not the global one: a program embedding omnictl keeps its own.
        self._provider = TracerProvider(resource=resource(target.model))
        self._processor = BatchSpanProcessor(
            self.exporter,
            max_queue_size=MAX_QUEUED_SPANS,
            max_export_batch_size=EXPORT_BATCH_SPANS,
            schedule_delay_millis=SCHEDULE_DELAY_MS,
        )
        self._provider.add_span_processor(self._processor)
        self._backlog: queue.Queue[Finished | None] = queue.Queue(maxsize=backlog)
        self._give_up = threading.Event()  # shutting down and out of time: drop what is left
        self._builder = threading.Thread(target=self._build_loop, name="omnictl-otlp-builder", daemon=True)
        self._builder.start()

    def add(self, events: Iterable[Event]) -> None:
        self.pending.add(events)

    def tick(self) -> None:
        """Hand the requests whose events are complete to the builder."""
        for finished in self.pending.take_due():
            self._hand_over(finished)

    def close(self) -> None:
        """Build what has ended, flush, stop: within BUILD_S + SHUTDOWN_S + one export's
        timeout, however the collector answers."""
        for finished in self.pending.take_ended():
            self._hand_over(finished)
        try:
            self._backlog.put(None, timeout=BUILD_S)  # the builder's stop, after what is queued
        except queue.Full:
            pass  # the builder is far behind: what it has not built when BUILD_S is over is dropped
        self._builder.join(BUILD_S)
        self._give_up.set()
        self.exporter.stop_at(time.monotonic() + SHUTDOWN_S)
        cut_short = threading.Timer(SHUTDOWN_S, self.exporter.shutdown)  # a retry waiting past the deadline
        cut_short.daemon = True
        cut_short.start()
        try:
            self._processor.shutdown()  # exports what is queued, then shuts the exporter down
        finally:
            cut_short.cancel()
            self.exporter.stop_filtering()
        if self.summary()["requests_not_built"] or self.exporter.failures or self.summary()["spans_not_sent"]:
            logger.info(
                "OpenTelemetry: %(requests_built)d requests' traces built, %(requests_not_built)d not "
                "(building fell behind); %(batches_failed)d batches of spans failed to export, "
                "%(spans_not_sent)d spans never sent (the export queue was full)",
                self.summary(),
            )

    def summary(self) -> dict[str, int]:
        """What was exported and what was not (final once :meth:`close` returned)."""
        return {
            "requests_built": self.built,  # sampled out or not
            "requests_not_built": self.dropped + self.handed - self.built,
            "batches_failed": self.exporter.failures,
            "spans_not_sent": self.spans - self.exporter.offered,
        }

    def _hand_over(self, finished: Finished) -> None:
        try:
            self._backlog.put_nowait(finished)
            self.handed += 1
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "OpenTelemetry: requests finish faster than their spans can be built; traces are "
                    "dropped (backlog of %d requests full; not logged again)",
                    self._backlog.maxsize,
                )

    def _build_loop(self) -> None:
        while (finished := self._backlog.get()) is not None and not self._give_up.is_set():
            self.spans += emit_trace(
                self._provider,
                self._processor,
                finished.request_id,
                finished.events,
                self.target.modalities,
                finished.truncated,
            )
            self.built += 1


def otlp_sink(options: dict[str, Any]) -> OtlpSink:
    """The collector's sink factory (see :func:`omnictl.telemetry.endpoint.sink_spec`)."""
    return OtlpSink(msgspec.convert(options, OtlpTarget))
