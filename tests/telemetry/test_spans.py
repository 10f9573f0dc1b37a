"""Building a request's OpenTelemetry spans from its recorded timeline (no server, no network)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.spans import build_trace
from tests.support.synthetic import synthetic_request
from omnictl.telemetry.spans import ROOT_NAME, emit_trace
from omnictl.telemetry.traceparent import parse_traceparent

RID = "9434fe23f99249c8a542498a1d49b250"
T0 = 1_796_000_000_000_000_000
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
MODALITIES = {"answer": "text", "speak": "audio", "decode": "text", "code2wav": "audio"}
K = EventKind


def recorded(admitted_meta: dict[str, Any] | None = None) -> list[Event]:
    """A request through the fast test topology (prep → answer, speak), as a real run recorded it
    (offsets in ns from admission)."""
    rows = [
        (K.ADMITTED, None, "coordinator", 0, admitted_meta or {"terminals": "answer,speak"}),
        (K.INPUT_RECEIVED, "prep", "prep", 3326066, {"source": None}),
        (K.QUEUE_ENTER, "prep", "prep", 3355069, {}),
        (K.BUILD_START, "prep", "prep", 3558661, {}),
        (K.BUILD_END, "prep", "prep", 7215828, {}),
        (K.STAGE_DONE, "prep", "prep", 7310178, {}),
        (K.HOP_SENT, "prep", "prep", 7425449, {"target": "answer", "transport": "shm", "bytes": 47}),
        (K.HOP_RECEIVED, "answer", "heads", 8143284, {"source": "prep", "transport": "shm"}),
        (K.INPUT_RECEIVED, "answer", "heads", 8157836, {"source": "prep"}),
        (K.QUEUE_ENTER, "answer", "heads", 8181180, {}),
        (K.BUILD_START, "answer", "heads", 8266417, {}),
        (K.HOP_SENT, "prep", "prep", 10920185, {"target": "speak", "transport": "shm", "bytes": 47}),
        (K.FIRST_EMIT, "answer", "heads", 11247751, {}),
        (K.FIRST_TEXT, "answer", "coordinator", 13536357, {}),
        (K.BUILD_END, "answer", "heads", 15661961, {}),
        (K.HOP_RECEIVED, "speak", "heads", 15742631, {"source": "prep", "transport": "shm"}),
        (K.INPUT_RECEIVED, "speak", "heads", 15752125, {"source": "prep"}),
        (K.QUEUE_ENTER, "speak", "heads", 15771894, {}),
        (K.STAGE_DONE, "answer", "heads", 15868698, {}),
        (K.BUILD_START, "speak", "heads", 15915007, {}),
        (K.FIRST_EMIT, "speak", "heads", 18696524, {}),
        (K.BUILD_END, "speak", "heads", 18876732, {}),
        (K.STAGE_DONE, "speak", "heads", 18898514, {}),
        (K.TERMINAL_COMPLETE, "answer", "coordinator", 28271373, {}),
        (K.FIRST_AUDIO, "speak", "coordinator", 28438611, {}),
        (K.TERMINAL_COMPLETE, "speak", "coordinator", 31522217, {}),
        (K.COMPLETED, None, "coordinator", 31552411, {}),
    ]
    return [Event(kind, RID, stage, process, T0 + offset, meta) for kind, stage, process, offset, meta in rows]


def exported(events: list[Event], request_id: str = RID, truncated: int = 0) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    made = emit_trace(TracerProvider(), SimpleSpanProcessor(memory), request_id, events, MODALITIES, truncated)
    spans = list(memory.get_finished_spans())
    assert made == len(spans) or not spans  # (a caller that does not sample gets none recorded)
    return spans


def by_name(spans: list[ReadableSpan], name: str, stage: str | None = None) -> ReadableSpan:
    found = [s for s in spans if s.name == name and (stage is None or s.attributes.get("omnictl.stage") == stage)]
    assert len(found) == 1, (name, stage, [s.name for s in spans])
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_the_recorded_timeline_becomes_a_tree_under_the_callers_span() -> None:
    meta = {"terminals": "answer,speak", **parse_traceparent(CALLER)}  # type: ignore[dict-item]
    spans = exported(recorded(meta))
    root = by_name(spans, ROOT_NAME)
    assert root.context.trace_id == 0x4bf92f3577b34da6a3ce929d0e0e4736
    assert parent_of(root) == 0x00f067aa0ba902b7 and root.parent is not None and root.parent.is_remote
    assert root.kind is SpanKind.SERVER
    assert (root.start_time, root.end_time) == (T0, T0 + 31552411)
    assert root.attributes["omnictl.request_id"] == RID and root.attributes["omnictl.outcome"] == "completed"
    assert list(root.attributes["omnictl.modalities"]) == ["audio", "text"]
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}

    stages = {name: by_name(spans, f"stage {name}") for name in ("prep", "answer", "speak")}
    assert all(parent_of(s) == root.context.span_id for s in stages.values())
    assert stages["answer"].attributes["omnictl.process"] == "heads"
    # prep: its first event (input received) to its last (the hop sent to speak)
    assert (stages["prep"].start_time, stages["prep"].end_time) == (T0 + 3326066, T0 + 10920185)

    # Waiting and computing at each stage: children of its span, at the recorded times.
    queue = by_name(spans, "queue", "answer")
    assert parent_of(queue) == stages["answer"].context.span_id
    assert (queue.start_time, queue.end_time) == (T0 + 8181180, T0 + 8266417)  # queue_enter → build_start
    build = by_name(spans, "build", "speak")
    assert parent_of(build) == stages["speak"].context.span_id
    assert (build.start_time, build.end_time) == (T0 + 15915007, T0 + 18876732)
    unpack = by_name(spans, "unpack", "speak")
    assert parent_of(unpack) == stages["speak"].context.span_id

    # Hops: children of the sending stage, sent → received, with transport and bytes.
    hop = by_name(spans, "hop prep → speak")
    assert parent_of(hop) == stages["prep"].context.span_id
    assert (hop.start_time, hop.end_time) == (T0 + 10920185, T0 + 15742631)
    assert hop.attributes["omnictl.transport"] == "shm" and hop.attributes["omnictl.bytes"] == 47
    assert hop.attributes["omnictl.target"] == "speak" and hop.attributes["omnictl.target_process"] == "heads"

    # Marks are events: the request's on the root, a stage's own first emit on its span.
    assert [(e.name, e.timestamp) for e in root.events] == [
        ("first_text", T0 + 13536357), ("terminal_complete", T0 + 28271373),
        ("first_audio", T0 + 28438611), ("terminal_complete", T0 + 31522217)]
    assert [e.name for e in stages["answer"].events] == ["first_emit"]
    # one OpenTelemetry span per span omnictl trace shows (marks aside)
    trace = build_trace(RID, recorded())
    assert len(spans) == 1 + len([s for s in trace.spans if s.kind != "mark"])


def test_without_a_caller_the_request_starts_a_trace_of_its_own() -> None:
    spans = exported(recorded())
    root = by_name(spans, ROOT_NAME)
    assert root.parent is None and root.status.status_code is StatusCode.UNSET
    assert all(s.context.trace_id == root.context.trace_id for s in spans)


def test_a_failure_marks_the_root_and_the_stage_that_failed() -> None:
    events = [e for e in recorded() if e.ts <= T0 + 8266417 and e.kind is not K.COMPLETED]
    events.append(Event(K.FAILED, RID, "answer", "coordinator", T0 + 9_000_000, {"error": "answer broke"}))
    spans = exported(events)
    root = by_name(spans, ROOT_NAME)
    assert root.status.status_code is StatusCode.ERROR and root.status.description == "answer broke"
    assert root.attributes["omnictl.outcome"] == "failed" and root.attributes["omnictl.failed_stage"] == "answer"
    assert by_name(spans, "stage answer").status.status_code is StatusCode.ERROR
    assert by_name(spans, "stage prep").status.status_code is StatusCode.UNSET
    assert "failed" in [e.name for e in root.events]


def test_streams_fan_in_prefill_and_decode_hang_under_their_stages() -> None:
    events = synthetic_request("synthetic", start_ns=T0, chunks=3)
    spans = exported(events, "synthetic", truncated=5)
    stage = {s.attributes["omnictl.stage"]: s for s in spans if s.name.startswith("stage ")}
    root = by_name(spans, ROOT_NAME)
    assert root.attributes["omnictl.events_dropped"] == 5
    assert parent_of(by_name(spans, "fanin_wait", "mm_aggregate")) == stage["mm_aggregate"].context.span_id
    for phase in ("prefill", "decode"):
        assert parent_of(by_name(spans, phase, "thinker")) == stage["thinker"].context.span_id
    assert by_name(spans, "decode", "thinker").attributes["omnictl.steps"] == 12
    streams = [s for s in spans if s.name == "stream thinker → talker"]
    assert sorted(s.attributes["omnictl.seq"] for s in streams) == [0, 1, 2]
    assert all(parent_of(s) == stage["thinker"].context.span_id for s in streams)
    # The coordinator's hop to the entry stage belongs to no stage: it hangs under the root.
    assert parent_of(by_name(spans, "hop coordinator → preprocessing")) == root.context.span_id


@pytest.mark.parametrize("header", [
    None, "", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    CALLER + "x" * 600,
])
def test_a_malformed_traceparent_is_no_caller(header: str | None) -> None:
    assert parse_traceparent(header) is None


def test_a_traceparent_gives_the_callers_ids_and_sampling() -> None:
    assert parse_traceparent(CALLER) == {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                                         "parent_span_id": "00f067aa0ba902b7", "trace_flags": 1}
    assert parse_traceparent(CALLER[:-2] + "00")["trace_flags"] == 0  # type: ignore[index]


def test_a_caller_that_does_not_sample_gets_no_spans() -> None:
    """The SDK's default sampler follows the caller's sampled flag (W3C trace-flags)."""
    meta = {"terminals": "answer,speak", **parse_traceparent(CALLER[:-2] + "00")}  # type: ignore[dict-item]
    assert exported(recorded(meta)) == []


def test_the_sampler_decides_before_anything_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_SAMPLER is the SDK's: a request sampled out costs no span building (here
    ``build_trace`` would raise, there being no events)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    memory = InMemorySpanExporter()
    assert emit_trace(TracerProvider(), SimpleSpanProcessor(memory), RID, [], MODALITIES) == 0
    assert memory.get_finished_spans() == ()
