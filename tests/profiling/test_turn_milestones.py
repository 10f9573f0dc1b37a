"""A realtime turn's milestones (TurnClock) as the profiler sees them: in the trace of the
turn's id, in the aggregator's turn latency, and on the dashboard at 80 columns."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from rich.console import Console

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.dashboard import render_dashboard, status_line
from omnictl.profiling.events import Event, EventKind, MetaValue
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore
from omnictl.profiling.trace_render import render_waterfall
from omnictl.serving.realtime.session.milestones import MILESTONES, TurnClock

MS = 1_000_000


class Recorded:
    """A profiler test double: keeps what is recorded, stamped by the test's clock."""

    def __init__(self, clock: list[int]) -> None:
        self.events: list[Event] = []
        self._clock = clock

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: MetaValue) -> None:
        self.events.append(Event(kind, request_id, stage, "server", self._clock[0], meta))


def _turn(recorded: Recorded, clock: list[int], turn_id: str, steps_ms: dict[str, int],
          histogram: Histogram | None = None) -> TurnClock:
    turn = TurnClock(turn_id, "sess_1", recorded, histogram, clock=lambda: clock[0])
    start = clock[0]
    for milestone, at_ms in steps_ms.items():
        clock[0] = start + at_ms * MS
        turn.mark(milestone, request="resp_req_1" if milestone != "speech_stopped" else None)
    return turn


STEPS = {"speech_stopped": 0, "turn_confirmed": 5, "transcript_final": 240, "response_started": 241,
         "first_token": 360, "first_clause": 700, "first_audio_sent": 702}


def test_each_milestone_is_stamped_once_from_the_end_of_speech_and_observed() -> None:
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    histogram = Histogram("t_seconds", "t", ["milestone"], registry=CollectorRegistry())
    turn = _turn(recorded, clock, "item_1", STEPS, histogram)
    clock[0] += 50 * MS
    assert not turn.mark("first_token")  # the second token: already stamped
    assert [e.meta["milestone"] for e in recorded.events] == list(STEPS)
    assert [e.meta["since_stop_s"] for e in recorded.events] == [ms / 1000 for ms in STEPS.values()]
    assert turn.since_stop_s("first_audio_sent") == pytest.approx(0.702)
    assert histogram.labels("first_audio_sent")._sum.get() == pytest.approx(0.702)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown turn milestone 'first_word'; one of: preempted, speech_stopped"):
        turn.mark("first_word")


def test_a_dropped_preemptive_answer_restarts_the_turn_at_the_next_end_of_speech() -> None:
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    turn = _turn(recorded, clock, "item_1", {"speech_stopped": 0, "response_started": 10, "first_token": 90})
    clock[0] += 300 * MS
    turn.mark("preemptive_dropped", request="resp_req_1")
    assert recorded.events[-1].meta["since_stop_s"] == pytest.approx(0.39) and turn.dropped == 1
    clock[0] += 1000 * MS  # the user spoke on, then stopped again
    turn.mark("speech_stopped")
    clock[0] += 400 * MS
    assert turn.mark("first_audio_sent")
    assert turn.since_stop_s("first_audio_sent") == pytest.approx(0.4)


def test_a_preemptive_answer_used_measures_its_turn_from_the_pause() -> None:
    """The answer started at the pause: the pause is the end of speech, every figure from it
    (speech stopped comes later, where the VAD confirmed the same end)."""
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    turn = _turn(recorded, clock, "item_1", {"preempted": 0, "response_started": 150, "speech_stopped": 300,
                                             "turn_confirmed": 301, "first_audio_sent": 420})
    assert [e.meta["since_stop_s"] for e in recorded.events] == [0.0, 0.15, 0.3, 0.301, 0.42]
    assert turn.since_stop_s("first_audio_sent") == pytest.approx(0.42)


def test_a_held_answers_milestones_marked_at_its_release_are_stamped_and_drawn_when_they_happened() -> None:
    """A preemptive answer is read at its release: its transcript, first token and clause
    came before, at the times given, and the trace and the figures put them there."""
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    start = clock[0]
    turn = _turn(recorded, clock, "item_9", {"preempted": 0, "response_started": 150, "speech_stopped": 500,
                                             "turn_confirmed": 500})
    clock[0] = start + 520 * MS  # the release
    for milestone, at_ms in (("transcript_final", 140), ("first_token", 260), ("first_clause", 480)):
        assert turn.mark(milestone, request="resp_req_1", at_ns=start + at_ms * MS)
    turn.mark("first_audio_sent", request="resp_req_1")
    assert turn.since_stop_s("first_token") == pytest.approx(0.26)
    late = {e.meta["milestone"]: e.meta.get("ago_s") for e in recorded.events}
    assert late == {"preempted": None, "response_started": None, "speech_stopped": None, "turn_confirmed": None,
                    "transcript_final": 0.38, "first_token": 0.26, "first_clause": 0.04, "first_audio_sent": None}
    trace = build_trace("item_9", recorded.events)
    drawn = [(s.name, (s.start_ns - start) // MS) for s in trace.of_kind("milestone")]
    assert drawn == [("preempted", 0), ("transcript_final", 140), ("response_started", 150), ("first_token", 260),
                     ("first_clause", 480), ("speech_stopped", 500), ("turn_confirmed", 500),
                     ("first_audio_sent", 520)]


def test_the_trace_of_a_turn_draws_its_milestones_in_order() -> None:
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    _turn(recorded, clock, "item_7", STEPS)
    trace = build_trace("item_7", recorded.events)
    assert trace.status == "turn"
    assert [s.name for s in trace.of_kind("milestone")] == list(STEPS)
    assert trace.request.duration_ns == 702 * MS
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    console.print(render_waterfall(trace, width=80))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.splitlines()[0].startswith("turn item_7")
    listed = text.splitlines()
    lines = [line.strip() for line in listed[listed.index("milestones (from the end of speech; the pipeline request each came from):") + 1:]]
    assert lines[0].startswith("S speech stopped +0")
    assert lines[-1] == "A first audio sent +702 ms  (resp_req_1)"
    assert [line.split()[0] for line in lines] == ["S", "C", "W", "R", "T", "K", "A"]
    row = next(line for line in text.splitlines() if line.startswith("turn ") and "|" in line)
    assert row.index("C") < row.index("R") < row.index("T") < row.index("A")  # a later mark covers one in its column


def test_the_dashboard_shows_turn_latency_p50_p90_at_80_columns() -> None:
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    for index, first_audio_ms in enumerate([300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200]):
        clock[0] += 2000 * MS
        _turn(recorded, clock, f"item_{index}", {"speech_stopped": 0, "first_audio_sent": first_audio_ms})
    aggregator = Aggregator(window_s=60)
    aggregator.add(recorded.events)
    snapshot = aggregator.snapshot(now=clock[0])
    assert (snapshot.header.turn_p50_s, snapshot.header.turn_p90_s, snapshot.header.turn_n) == (0.7, 1.1, 10)
    assert snapshot.header.in_flight == 0 and snapshot.header.completed == 0  # turns are not requests
    console = Console(width=80, height=24, record=True, file=io.StringIO(), color_system=None)
    console.print(render_dashboard(snapshot))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "turn latency p50 700 ms p90 1.10 s (n=10)" in text
    assert "turn latency p50 700 ms p90 1.10 s (n=10)" in status_line(snapshot)


def test_without_turns_the_dashboard_says_nothing_of_them() -> None:
    snapshot = Aggregator(window_s=60).snapshot()
    assert "turn latency" not in status_line(snapshot)


def test_every_milestone_has_a_mark_on_the_waterfall() -> None:
    from omnictl.profiling.trace_render import MILESTONE_MARKS

    assert list(MILESTONE_MARKS) == list(MILESTONES)


def test_the_trace_store_lists_a_turn_with_its_milestones_extent(tmp_path: Path) -> None:
    clock = [time.time_ns()]
    recorded = Recorded(clock)
    _turn(recorded, clock, "item_3", STEPS)
    store = TraceStore(tmp_path)
    store.append(recorded.events)
    store.close()
    [summary] = TraceStore(tmp_path).select(slowest=5)  # finished: --slowest lists it
    assert (summary.request_id, summary.status, summary.duration_s) == ("item_3", "turn", pytest.approx(0.702))
