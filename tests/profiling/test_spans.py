"""Spans derived from one request's events through the 8-stage Qwen-Omni topology."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.spans import RequestTrace, build_trace, derive_spans
from tests.support.synthetic import qwen_omni_topology, synthetic_request
from omnictl.topology.model import EdgeKind

MS = 1_000_000
TOPOLOGY = qwen_omni_topology()


def assert_consistent(trace: RequestTrace) -> None:
    request = trace.request
    assert request.end_ns >= request.start_ns
    for span in trace.spans:
        assert span.end_ns >= span.start_ns, f"negative duration: {span}"
        assert request.start_ns <= span.start_ns and span.end_ns <= request.end_ns, f"outside the request: {span}"


def test_every_stage_and_edge_crossed_is_in_the_trace() -> None:
    trace = build_trace("r", synthetic_request("r", TOPOLOGY, start_ns=1000 * MS))
    assert trace.status == "completed"
    assert set(trace.stages) == set(TOPOLOGY.stages)
    hops = {(s.meta["src"], s.meta["dst"]) for s in trace.of_kind("hop")}
    streams = {(s.meta["src"], s.meta["dst"]) for s in trace.of_kind("stream")}
    assert hops == {(e.src, e.dst) for e in TOPOLOGY.edges if e.kind is EdgeKind.DATA} | {("coordinator", "preprocessing")}
    assert streams == {(e.src, e.dst) for e in TOPOLOGY.edges if e.kind is EdgeKind.STREAM}
    assert {s.name for s in trace.of_kind("mark")} >= {"first_text", "first_audio", "terminal_complete"}
    assert_consistent(trace)


def test_hops_run_from_the_senders_send_to_the_receivers_receive() -> None:
    events = synthetic_request("r", TOPOLOGY, start_ns=1000 * MS)
    trace = build_trace("r", events)
    for hop in trace.of_kind("hop", "stream"):
        src, dst = hop.meta["src"], hop.meta["dst"]
        sent_kind, received_kind = (
            (EventKind.HOP_SENT, EventKind.HOP_RECEIVED) if hop.kind == "hop" else (EventKind.STREAM_SENT, EventKind.STREAM_RECEIVED)
        )
        sends = [e.ts for e in events if e.kind is sent_kind and (e.stage or e.process) == src and e.meta.get("target") == dst]
        receives = [e.ts for e in events if e.kind is received_kind and e.stage == dst and e.meta.get("source") == src]
        assert hop.start_ns in sends and hop.end_ns in receives
        assert hop.start_ns <= hop.end_ns
        if src != "coordinator":
            edge_kind = EdgeKind.DATA if hop.kind == "hop" else EdgeKind.STREAM
            assert hop.meta["transport"] == TOPOLOGY.edge(str(src), str(dst), edge_kind).transport.value


def test_stage_segments() -> None:
    trace = build_trace("r", synthetic_request("r", TOPOLOGY, start_ns=1000 * MS, chunks=3))
    by_stage_kind = {(s.stage, s.kind): s for s in trace.spans}
    fanin = by_stage_kind[("mm_aggregate", "fanin_wait")]
    arrivals = [e.ts for e in trace.events if e.kind is EventKind.INPUT_RECEIVED and e.stage == "mm_aggregate"]
    assert (fanin.start_ns, fanin.end_ns) == (min(arrivals), max(arrivals))
    decode = by_stage_kind[("thinker", "decode")]
    assert decode.meta["steps"] == 12
    assert by_stage_kind[("thinker", "prefill")].end_ns <= decode.start_ns + 1
    assert ("decode", "prefill") not in by_stage_kind  # decode is a simple stage
    for stage in TOPOLOGY.stages:
        assert (stage, "queue") in by_stage_kind and (stage, "build") in by_stage_kind
    assert trace.stage_process["decode"] == "thinker", "coordinator-recorded marks don't own the stage"


def test_aborted_request_clips_late_stage_work() -> None:
    events = [e for e in synthetic_request("r", TOPOLOGY, start_ns=1000 * MS) if e.kind is not EventKind.COMPLETED]
    abort_at = 1000 * MS + 15 * MS
    events.append(Event(EventKind.ABORTED, "r", None, "coordinator", abort_at))
    trace = build_trace("r", events)
    assert trace.status == "aborted" and trace.request.end_ns == abort_at
    assert_consistent(trace)
    talker = next(s for s in trace.spans if s.kind == "stage" and s.stage == "talker")
    assert talker.meta.get("clipped") is True


def test_unknown_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="no events for request 'nope'"):
        build_trace("nope", synthetic_request("r"))


def test_derive_spans_covers_each_request() -> None:
    events = synthetic_request("a", start_ns=1000 * MS) + synthetic_request("b", start_ns=2000 * MS)
    requests = [s for s in derive_spans(events) if s.kind == "request"]
    assert [s.name for s in requests] == ["a", "b"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), keep=st.floats(0.05, 1.0))
def test_spans_stay_consistent_with_lost_and_reordered_events(seed: int, keep: float) -> None:
    rng = random.Random(seed)
    events = synthetic_request("r", TOPOLOGY, start_ns=1000 * MS, chunks=rng.randint(1, 4))
    survivors = [e for e in events if rng.random() < keep] or events[:1]
    rng.shuffle(survivors)
    assert_consistent(build_trace("r", survivors))
