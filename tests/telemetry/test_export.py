"""OtlpSink: finished requests' spans reach a real OTLP/HTTP receiver; an unreachable one costs
one warning and a bounded shutdown; the profiling collector feeds the sink as it receives."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from omnictl.profiling.collector import Collector
from omnictl.profiling.events import EventKind
from tests.support.synthetic import synthetic_request
from omnictl.telemetry.endpoint import OtlpTarget, sink_spec
from omnictl.telemetry.export import OtlpSink, WarnOnceExporter
from omnictl.telemetry.pending import PendingTraces
from tests.serving.harness import wait_until
from tests.support.otlp import OtlpReceiver


@pytest.fixture()
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture()
def records() -> Iterator[list[logging.LogRecord]]:
    """What omnictl.telemetry.export logs (its own handler: the omnictl logger may not propagate)."""
    caught: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = caught.append  # type: ignore[method-assign]
    log = logging.getLogger("omnictl.telemetry.export")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    yield caught
    log.removeHandler(handler)
    log.setLevel(old_level)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_close_exports_every_ended_request_at_once(receiver: OtlpReceiver) -> None:
    sink = OtlpSink(OtlpTarget(receiver.url + "/v1/traces", "m"), pending=PendingTraces(grace_s=60.0))
    for rid in ("r1", "r2"):
        sink.add(synthetic_request(rid))
    sink.tick()  # within the grace period: nothing yet
    assert sink.built == 0
    started = time.monotonic()
    sink.close()  # shutting down: no grace, and the processor flushes
    assert time.monotonic() - started < 2.0
    assert receiver.of_request("r1") and receiver.of_request("r2")
    assert sink.summary() == {"requests_built": 2, "requests_not_built": 0, "batches_failed": 0, "spans_not_sent": 0}
    root = next(s for s in receiver.of_request("r1") if s.name == "omnictl.request")
    assert root.resource["omnictl.model"] == "m" and root.resource["service.name"] == "omnictl"


def test_an_unreachable_endpoint_is_one_warning_and_a_bounded_shutdown(records: list[logging.LogRecord]) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1/traces"
    sink = OtlpSink(OtlpTarget(dead, "m"), pending=PendingTraces(grace_s=0.0))
    for batch in range(2):
        sink.add(synthetic_request(f"r{batch}"))
        sink.tick()
        wait_until(lambda: sink.built == batch + 1, timeout=10)
        sink._processor.force_flush()  # one export attempt per batch, now
    assert sink.exporter.failures == 2
    assert sink.summary() == {"requests_built": 2, "requests_not_built": 0, "batches_failed": 2, "spans_not_sent": 0}
    started = time.monotonic()
    sink.close()
    assert time.monotonic() - started < 4.0
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in records]
    assert dead in warnings[0].getMessage() and "cannot export traces" in warnings[0].getMessage()


class Flaky(SpanExporter):
    """A test double for the OTLP exporter: each export fails or succeeds as scripted."""

    def __init__(self, script: list[bool]) -> None:
        self.script = script

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS if self.script.pop(0) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def test_each_outage_is_one_warning_and_its_end_one_line(records: list[logging.LogRecord]) -> None:
    exporter = WarnOnceExporter(Flaky([False, False, True, True, False, False]), "http://x/v1/traces")
    results = [exporter.export([]) for _ in range(6)]
    assert results.count(SpanExportResult.FAILURE) == 4 and exporter.failures == 4
    assert [(r.levelname, "cannot export" in r.getMessage()) for r in records] == [
        ("WARNING", True), ("INFO", False), ("WARNING", True)]
    assert "again" in records[1].getMessage()


def test_the_collector_feeds_the_sink_as_events_arrive(tmp_path: Path, receiver: OtlpReceiver) -> None:
    collector = Collector(tmp_path / "run", f"ipc://{tmp_path}/profile", separate_process=False,
                          sink=sink_spec(OtlpTarget(receiver.url + "/v1/traces", "m", {"stage-a": "text"}))).start()
    recorder = collector.local_recorder("coordinator")
    try:
        recorder.record(EventKind.ADMITTED, "req", None, terminals="stage-a")
        recorder.record(EventKind.QUEUE_ENTER, "req", "stage-a")
        recorder.record(EventKind.STAGE_DONE, "req", "stage-a")
        recorder.record(EventKind.COMPLETED, "req", None)
        spans = receiver.wait_for(lambda: receiver.of_request("req"), timeout=10)  # grace + one batch delay
    finally:
        recorder.close()
        collector.close()
    assert {s.name for s in spans} == {"omnictl.request", "stage stage-a", "queue"}
    root = next(s for s in spans if s.name == "omnictl.request")
    assert root.attributes["omnictl.modalities"] == ["text"] and root.resource["omnictl.model"] == "m"
