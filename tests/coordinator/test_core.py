"""The coordinator's request state alone: no sockets, no processes, no event loop of its own.

Each test drives :class:`CoordinatorCore` with what the shell would feed it and checks both
what it holds afterwards and what it asks to broadcast.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import numpy as np
import pytest

from omnictl import messages as m
from omnictl.coordinator.core import Admitted, CoordinatorCore, Replayed
from omnictl.coordinator.request import RequestEvent, RequestEventKind, RequestState
from omnictl.exceptions import InvalidRequest, PipelineDead, RequestAborted, RequestFailed
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.profiling.events import EventKind
from omnictl.topology import loads
from tests.support.profiler import RecordingProfiler
from tests.support.wait import run  # records own futures: a test body runs inside a loop

T = TypeVar("T")

# text and audio terminals; the audio branch runs in a replicated process
TOPOLOGY = """
stages:
  - {name: prep, factory: m.prep, next: [thinker]}
  - {name: thinker, factory: m.thinker, next: [text, tts], process: brain}
  - {name: text, factory: m.text, terminal: true, modality: text, process: brain}
  - {name: tts, factory: m.tts, terminal: true, modality: audio, process: voice}
processes:
  voice: {replicas: 2}
"""


def core(request_timeout: float = 10.0, replay_limit: int = 0) -> tuple[CoordinatorCore, RecordingProfiler]:
    """``replay_limit`` 0 unless a test is about replays: a death then fails what it held."""
    recorder = RecordingProfiler()
    c = CoordinatorCore(loads(TOPOLOGY), request_timeout=request_timeout, profiler=recorder, replay_limit=replay_limit)
    return c, recorder


def started(c: CoordinatorCore, request_id: str, modalities: list[str] | None = None, now: float = 0.0) -> Admitted:
    admitted = c.admit(now, modalities, request_id)
    c.commit(admitted, {"inputs of": request_id})
    return admitted


def events(c: CoordinatorCore, admitted: Admitted) -> list[RequestEvent | None]:
    queue = admitted.record.events
    return [queue.get_nowait() for _ in range(queue.qsize())]


def assert_holds_nothing(c: CoordinatorCore) -> None:
    assert c.held() == {"requests": 0, "placed": 0, "replica_in_flight": 0, "replays_waiting": 0}


# --- submit ---------------------------------------------------------------------------


def test_admit_places_the_request_and_commit_makes_it_running() -> None:
    async def body() -> None:
        c, rec = core(request_timeout=7.0)
        admitted = c.admit(100.0, None, "r1", params={"voice": "joe"})
        assert admitted.entry == "prep" and admitted.instance == "prep"
        assert admitted.terminals == ("text", "tts")
        assert admitted.context.request_id == "r1"
        assert admitted.context.active == ("prep", "thinker", "text", "tts")
        assert admitted.context.params == {"voice": "joe", "modalities": ["audio", "text"]}
        assert admitted.context.replicas == {"voice": 0}
        assert admitted.record.deadline == 107.0
        assert admitted.record.expected == {"text", "tts"}
        assert "r1" not in c.requests and rec.events == []  # not running until committed
        c.commit(admitted)
        assert c.requests["r1"] is admitted.record
        assert admitted.record.state is RequestState.RUNNING
        assert rec.events == [(EventKind.ADMITTED, "r1", None, {"terminals": "text,tts"})]
        assert c.held() == {"requests": 1, "placed": 1, "replica_in_flight": 3, "replays_waiting": 0}

    run(body)


def test_a_selected_modality_prunes_terminals_and_stages() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1", ["text"])
        assert admitted.terminals == ("text",)
        assert admitted.context.active == ("prep", "thinker", "text")
        assert admitted.context.params["modalities"] == ["text"]
        assert admitted.context.replicas == {}  # the replicated voice process is not touched
        assert c.placement.in_flight == {"prep": 1, "brain": 1, "voice#0": 0, "voice#1": 0}

    run(body)


def test_the_trace_parent_rides_with_the_admitted_event() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = c.admit(0.0, None, "r1", trace_parent={"trace_id": "abc"})
        c.commit(admitted)
        assert rec.events[0][3] == {"terminals": "text,tts", "trace_id": "abc"}

    run(body)


def test_ids_are_generated_unique_and_a_reused_id_is_refused_while_running_and_after() -> None:
    async def body() -> None:
        c, _ = core()
        generated = {started(c, None).context.request_id for _ in range(3)}  # type: ignore[arg-type]
        assert len(generated) == 3 and all(len(rid) == 32 for rid in generated)
        started(c, "r1")
        with pytest.raises(InvalidRequest, match="'r1' was already used") as running:
            c.admit(0.0, None, "r1")
        assert running.value.field == "request_id"
        c.abort("r1")
        with pytest.raises(InvalidRequest, match="already used"):
            c.admit(0.0, None, "r1")

    run(body)


def test_a_withdrawn_request_leaves_no_trace_and_its_id_stays_usable() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = c.admit(0.0, None, "r1")
        c.withdraw(admitted)
        assert_holds_nothing(c)
        assert rec.events == []
        started(c, "r1")  # not remembered as used

    run(body)


def test_replicas_alternate_and_a_down_replica_is_skipped() -> None:
    async def body() -> None:
        c, _ = core()
        picks = [started(c, f"r{i}").context.replicas["voice"] for i in range(4)]
        assert sorted(picks) == [0, 0, 1, 1]
        c.process_died("voice#0", "killed by SIGKILL")
        assert started(c, "late").context.replicas == {"voice": 1}

    run(body)


def test_a_process_with_no_replica_up_refuses_new_requests_naming_why() -> None:
    async def body() -> None:
        c, _ = core()
        c.process_died("voice#0", "exit code 1")
        c.process_died("voice#1", "exit code 2")
        with pytest.raises(PipelineDead, match="every replica of process 'voice'.*exit code 1.*exit code 2"):
            c.admit(0.0, None, "r1")
        started(c, "text-only", ["text"])  # a request that never touches voice still runs
        assert c.health()[0] == "down"

    run(body)


def test_a_dead_pipeline_refuses_every_request_with_its_reason() -> None:
    async def body() -> None:
        c, _ = core()
        c.process_died("prep", "killed by SIGKILL")
        c.lose("prep", "prep is gone for good")
        assert c.dead_reason == "prep is gone for good"
        with pytest.raises(PipelineDead, match="prep is gone for good"):
            c.admit(0.0, ["text"], "r1")

    run(body)


# --- terminal outputs and completion ----------------------------------------------------


def test_a_request_completes_only_when_every_expected_terminal_has_reported() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1")
        assert c.terminal_output("r1", "text", 0, False, "hel") == []
        assert c.terminal_output("r1", "text", 1, True, "hello") == []
        assert admitted.record.state is RequestState.RUNNING and admitted.record.expected == {"tts"}
        assert c.terminal_output("r1", "tts", 0, True, b"wav") == []  # completing broadcasts nothing
        assert admitted.record.state is RequestState.COMPLETED
        assert await asyncio.wait_for(admitted.record.outcome, 1) == {"text": "hello", "tts": b"wav"}
        assert [(e.kind, e.stage, e.data) for e in events(c, admitted) if e is not None] == [
            (RequestEventKind.STREAM, "text", "hel"),
            (RequestEventKind.RESULT, "text", "hello"),
            (RequestEventKind.RESULT, "tts", b"wav"),
        ]
        assert rec.kinds("r1") == [EventKind.ADMITTED, EventKind.FIRST_TEXT, EventKind.TERMINAL_COMPLETE,
                                   EventKind.FIRST_AUDIO, EventKind.TERMINAL_COMPLETE, EventKind.COMPLETED]
        assert_holds_nothing(c)
        assert "r1" in c.recent

    run(body)


def test_first_output_is_marked_once_per_terminal_by_its_modality() -> None:
    async def body() -> None:
        c, rec = core()
        started(c, "r1")
        c.terminal_output("r1", "tts", 0, False, b"a")
        c.terminal_output("r1", "tts", 1, False, b"b")
        c.terminal_output("r1", "text", 0, False, "x")
        firsts = [(kind, stage) for kind, _, stage, _ in rec.events if kind in (EventKind.FIRST_AUDIO, EventKind.FIRST_TEXT)]
        assert firsts == [(EventKind.FIRST_AUDIO, "tts"), (EventKind.FIRST_TEXT, "text")]

    run(body)


def test_first_audio_is_marked_at_the_first_chunk_with_samples_not_at_an_empty_one() -> None:
    """A talker that ends on its first step makes the vocoder return no samples: nothing was
    heard, so the trace's first audio waits for a chunk that holds some (or never comes)."""

    async def body() -> None:
        c, rec = core()
        started(c, "r1")
        c.terminal_output("r1", "tts", 0, False, AudioChunk(samples=np.zeros(0, np.float32), sample_rate=16000))
        assert EventKind.FIRST_AUDIO not in rec.kinds("r1")
        c.terminal_output("r1", "tts", 1, False, AudioChunk(samples=np.ones(4, np.float32), sample_rate=16000))
        c.terminal_output("r1", "tts", 2, False, AudioChunk(samples=np.ones(4, np.float32), sample_rate=16000))
        assert rec.kinds("r1").count(EventKind.FIRST_AUDIO) == 1
        started(c, "r2")
        c.terminal_output("r2", "tts", 0, True, AudioResult(samples=np.zeros(0, np.float32), sample_rate=16000))
        assert EventKind.FIRST_AUDIO not in rec.kinds("r2")

    run(body)


def test_outputs_for_a_finished_or_unknown_request_are_dropped() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1")
        c.abort("r1")
        before = len(rec.events)
        assert c.terminal_output("r1", "text", 0, True, "late") == []
        assert c.terminal_output("nobody", "text", 0, True, "x") == []
        assert len(rec.events) == before and admitted.record.results == {}

    run(body)


def test_a_skipped_terminal_is_no_longer_expected() -> None:
    async def body() -> None:
        c, _ = core()
        admitted = started(c, "r1")
        assert c.stage_message(m.TerminalSkipped("r1", "tts")) == []
        assert admitted.record.expected == {"text"} and admitted.record.state is RequestState.RUNNING
        c.terminal_output("r1", "text", 0, True, "hi")
        assert await admitted.record.outcome == {"text": "hi"}
        assert c.stage_message(m.TerminalSkipped("r1", "text")) == []  # finished: ignored

    run(body)


def test_every_terminal_skipped_fails_the_request_and_aborts_it_everywhere() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1")
        c.stage_message(m.TerminalSkipped("r1", "text"))
        assert c.stage_message(m.TerminalSkipped("r1", "tts")) == [m.Abort(("r1",))]
        with pytest.raises(RequestFailed, match="every branch was skipped"):
            await admitted.record.outcome
        assert rec.kinds("r1")[-1] is EventKind.FAILED
        assert_holds_nothing(c)

    run(body)


# --- failure, abort, deadlines -----------------------------------------------------------


def test_a_stage_failure_fails_the_request_naming_stage_and_field() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1")
        out = c.stage_message(m.StageFailed("r1", "thinker", "prompt too long", rejected=True, field="messages"))
        assert out == [m.Abort(("r1",))]
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed)
        assert (error.stage, error.field, admitted.record.state) == ("thinker", "messages", RequestState.FAILED)
        assert "prompt too long" in str(error)
        last = rec.events[-1]
        assert last[:3] == (EventKind.FAILED, "r1", "thinker") and last[3]["rejected"] is True
        ended = events(c, admitted)
        assert ended[-1] is None and ended[-2] is not None and ended[-2].kind is RequestEventKind.ERROR
        assert_holds_nothing(c)
        # a second failure of the same request changes nothing and broadcasts nothing
        assert c.stage_message(m.StageFailed("r1", "tts", "late")) == []

    run(body)


def test_a_failure_that_is_not_a_rejection_carries_no_rejected_mark() -> None:
    async def body() -> None:
        c, rec = core()
        started(c, "r1")
        c.fail("r1", "tts", "boom")
        assert rec.events[-1][3] == {"error": str(RequestFailed("r1", "boom", "tts"))}

    run(body)


def test_abort_ends_the_request_as_aborted_and_broadcasts_once() -> None:
    async def body() -> None:
        c, rec = core()
        admitted = started(c, "r1")
        assert c.abort("r1") == [m.Abort(("r1",))]
        assert admitted.record.state is RequestState.ABORTED
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestAborted) and (error.request_id, str(error)) == ("r1", "request r1 was aborted")
        assert rec.kinds("r1")[-1] is EventKind.ABORTED
        assert c.abort("r1") == [] and c.abort("never") == []
        assert_holds_nothing(c)

    run(body)


def test_only_requests_past_their_deadline_expire() -> None:
    async def body() -> None:
        c, rec = core(request_timeout=5.0)
        early = started(c, "early", now=0.0)
        late = started(c, "late", now=3.0)
        assert c.expire(4.999) == []
        assert c.expire(5.0) == [m.Abort(("early",))]
        error = early.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage is None and error.request_id == "early"
        failed = [meta for kind, rid, _, meta in rec.events if kind is EventKind.FAILED and rid == "early"]
        assert failed == [{"error": str(error)}]  # a missed deadline is no rejection of the input
        assert "missed its deadline of 5s; terminals still expected: ['text', 'tts']" in str(error)
        assert late.record.state is RequestState.RUNNING
        assert c.expire(8.0) == [m.Abort(("late",))]
        assert_holds_nothing(c)

    run(body)


def test_shutdown_aborts_every_running_request() -> None:
    async def body() -> None:
        c, _ = core()
        a, b = started(c, "a"), started(c, "b")
        assert c.shutdown() == [m.Abort(("a",)), m.Abort(("b",))]
        for admitted in (a, b):
            error = admitted.record.outcome.exception()
            assert isinstance(error, RequestAborted) and "shut down" in str(error)
        assert_holds_nothing(c)

    run(body)


# --- backpressure -----------------------------------------------------------------------


def test_inbox_state_reports_only_changes_of_the_hold() -> None:
    c, _ = core()
    assert c.inbox_state("brain", "thinker", True) is True
    assert c.inbox_state("voice#0", "tts", True) is None  # already holding
    assert c.inbox_state("brain", "thinker", False) is None  # tts is still full
    assert c.inbox_state("voice#0", "tts", False) is False
    assert c.inbox_state("voice#0", "tts", False) is None
    assert c.full_inboxes == set()


# --- process deaths ----------------------------------------------------------------------


def test_a_dead_replica_fails_only_its_requests_naming_the_stage_they_used() -> None:
    async def body() -> None:
        c, _ = core()
        on0, on1, text_only = started(c, "on0"), started(c, "on1"), started(c, "t", ["text"])
        assert (on0.context.replicas, on1.context.replicas) == ({"voice": 0}, {"voice": 1})
        death = c.process_died("voice#0", "killed by SIGKILL")
        assert death.why == "replica 'voice#0' (stages tts) died: killed by SIGKILL"
        assert death.failed == ["on0"]
        assert death.broadcasts == [m.Abort(("on0",)), m.ProcessLost("voice#0")]
        error = on0.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "tts"
        assert str(error).endswith(f"stage 'tts' failed: {death.why}")
        assert on1.record.state is RequestState.RUNNING and text_only.record.state is RequestState.RUNNING
        assert c.down == {"voice#0": death.why}
        assert c.health() == ("degraded", {"voice#0": death.why}) and not c.healthy

    run(body)


def test_a_dead_process_names_the_first_of_its_stages_each_request_was_using() -> None:
    async def body() -> None:
        c, _ = core()
        admitted = started(c, "r1", ["text"])
        death = c.process_died("brain", "exit code 3")
        assert death.why == "stage process 'brain' (stages thinker, text) died: exit code 3"
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "thinker"

    run(body)


def test_a_dead_process_with_nothing_pinned_still_reports_its_loss() -> None:
    c, _ = core()
    death = c.process_died("prep", "exit code 1")
    assert (death.failed, death.broadcasts, death.backpressure) == ([], [m.ProcessLost("prep")], None)


def test_the_full_inboxes_of_a_dead_process_are_forgotten_and_admission_resumes() -> None:
    c, _ = core()
    c.inbox_state("voice#0", "tts", True)
    assert c.process_died("voice#1", "exit code 1").backpressure is None  # voice#0 is still full
    assert c.process_died("voice#0", "exit code 1").backpressure is False
    assert c.full_inboxes == set()


def test_a_dead_process_keeps_admission_held_while_another_inbox_is_full() -> None:
    c, _ = core()
    c.inbox_state("voice#0", "tts", True)
    c.inbox_state("brain", "thinker", True)
    assert c.process_died("voice#0", "exit code 1").backpressure is None
    assert c.full_inboxes == {("brain", "thinker")}


def test_a_restarted_process_is_up_again_and_hears_the_aborts_it_missed() -> None:
    async def body() -> None:
        c, _ = core()
        started(c, "r1")
        death = c.process_died("prep", "killed by SIGKILL")
        assert c.process_back("prep", death.failed) == [m.Abort(("r1",))]
        assert c.down == {} and c.healthy and c.health() == ("ok", {})
        c.process_died("prep", "killed by SIGKILL")
        assert c.process_back("prep", []) == []

    run(body)


def test_the_pipeline_dies_only_when_a_process_has_lost_every_replica() -> None:
    c, _ = core()
    c.process_died("voice#0", "exit code 1")
    c.lose("voice#0", "voice#0 lost")
    assert c.dead_reason is None and c.lost == {"voice#0"}
    c.process_died("voice#1", "exit code 1")
    c.lose("voice#1", "voice#1 lost")
    assert c.dead_reason == "voice#1 lost"
    assert c.health()[0] == "down"


def test_health_is_down_when_every_replica_of_a_process_is_down() -> None:
    c, _ = core()
    c.process_died("voice#0", "x")
    assert c.health()[0] == "degraded"
    c.process_died("voice#1", "y")
    assert c.health() == ("down", {"voice#0": c.down["voice#0"], "voice#1": c.down["voice#1"]})


def test_nothing_is_held_after_many_requests_end_every_way() -> None:
    async def body() -> Any:
        c, _ = core(request_timeout=1.0)
        for i in range(40):
            started(c, f"r{i}", now=float(i % 2) * 10)
        for i in range(0, 10):
            c.terminal_output(f"r{i}", "text", 0, True, "t")
            c.terminal_output(f"r{i}", "tts", 0, True, b"a")
        for i in range(10, 20):
            c.abort(f"r{i}")
        for i in range(20, 25):
            c.fail(f"r{i}", "thinker", "boom")
        c.process_died("voice#1", "killed")
        c.expire(100.0)
        assert_holds_nothing(c)

    run(body)


def test_an_unresponsive_replica_gets_no_new_request_while_another_answers() -> None:
    async def body() -> None:
        c, _ = core()
        c.unresponsive = frozenset({"voice#0"})
        assert {started(c, f"r{i}").context.replicas["voice"] for i in range(3)} == {1}
        c.unresponsive = frozenset({"voice#0", "voice#1"})
        with pytest.raises(PipelineDead, match="every replica of process 'voice'"):
            c.admit(0.0, None, "late")
        assert c.health() == ("ok", {})  # unresponsive is not down: health is the server's liveness check

    run(body)


# --- replays -------------------------------------------------------------------------------


def test_a_dead_replica_replays_what_its_caller_saw_nothing_of_on_the_other_one() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=1)
        on0, on1 = started(c, "on0"), started(c, "on1")
        assert on0.context.replicas == {"voice": 0}
        c.stage_message(m.TerminalSkipped("on0", "text"))  # not output: the replay runs every branch again
        death = c.process_died("voice#0", "killed by SIGKILL")
        assert (death.failed, death.replayed, death.dropped) == ([], [Replayed("on0", "tts", 1)], ["on0"])
        assert death.broadcasts == [m.Abort(("on0",)), m.ProcessLost("voice#0")]
        assert on0.record.state is RequestState.RUNNING and c.held()["replays_waiting"] == 1
        (replay,) = c.take_replays()
        assert c.take_replays() == []  # placed once
        assert replay.record is on0.record and replay.instance == "prep" and replay.entry == "prep"
        assert replay.context.request_id == "on0~1" and replay.context.replicas == {"voice": 1}
        assert replay.context.params == on0.context.params and replay.record.inputs == {"inputs of": "on0"}
        # what the first attempt still had in flight is dropped; the replay's output counts
        assert c.terminal_output("on0", "text", 0, True, "stale") == []
        assert c.fail("on0", "tts", "stale failure") == []
        c.terminal_output("on0~1", "text", 0, True, "hello")
        c.terminal_output("on0~1", "tts", 0, True, b"wav")
        assert await asyncio.wait_for(on0.record.outcome, 1) == {"text": "hello", "tts": b"wav"}
        c.terminal_output("on1", "text", 0, True, "x")
        c.terminal_output("on1", "tts", 0, True, b"y")
        assert_holds_nothing(c)
        with pytest.raises(InvalidRequest, match="'on0~1' was already used"):
            c.admit(0.0, None, "on0~1")  # the stages remember the attempt's id as finished

    run(body)


def test_a_request_whose_caller_saw_output_fails_naming_the_stage_and_why_not_replayed() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=1)
        admitted = started(c, "r1")
        c.terminal_output("r1", "text", 0, False, "hel")
        assert admitted.record.inputs is None  # no longer held: nothing could replay it
        death = c.process_died("voice#0" if admitted.context.replicas["voice"] == 0 else "voice#1", "exit code 1")
        assert death.failed == ["r1"] and death.replayed == []
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "tts"
        assert str(error).endswith("(not replayed: its caller already received output it cannot resume from)")

    run(body)


def test_a_request_is_replayed_at_most_replay_limit_times_then_fails_naming_the_stage() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=2)
        admitted = started(c, "r1", ["text"])  # runs in prep and brain, one replica each
        for attempt in (1, 2):
            death = c.process_died("brain", "killed by SIGKILL")
            assert death.replayed == [Replayed("r1", "thinker", attempt)]
            assert c.take_replays() == []  # no replica of brain is up: it waits
            c.process_back("brain", death.dropped)
            (replay,) = c.take_replays()
            assert replay.context.request_id == f"r1~{attempt}"
        death = c.process_died("brain", "killed by SIGKILL")
        assert death.failed == ["r1"] and death.dropped == ["r1~2"]
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "thinker"
        assert str(error).endswith("died: killed by SIGKILL (replayed 2 time(s) already, the replay limit)")
        assert_holds_nothing(c)

    run(body)


def test_waiting_replays_go_in_arrival_order_and_aborts_and_deadlines_win() -> None:
    async def body() -> None:
        c, _ = core(request_timeout=5.0, replay_limit=1)
        records = {rid: started(c, rid, ["text"], now=now).record for rid, now in
                   [("a", 0.0), ("b", 0.0), ("late", 3.0), ("c", 0.0)]}
        death = c.process_died("prep", "killed by SIGKILL")
        assert [r.request_id for r in death.replayed] == ["a", "b", "late", "c"]
        assert c.abort("b") == []  # nothing runs: no stage to tell
        assert c.expire(6.0) == []  # a and c missed their deadline while waiting
        assert {rid: r.state for rid, r in records.items()} == {
            "a": RequestState.FAILED, "b": RequestState.ABORTED, "late": RequestState.RUNNING, "c": RequestState.FAILED}
        assert c.process_back("prep", death.dropped) == [m.Abort(("a", "b", "late", "c"))]
        assert [a.record.request_id for a in c.take_replays()] == ["late"]

    run(body)


def test_waiting_replays_fail_naming_the_stage_once_no_replica_can_come_back() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=1)
        admitted = started(c, "r1", ["text"])
        c.process_died("prep", "killed by SIGKILL")
        assert c.fail_waiting_replays() == []  # it may restart
        c.lose("prep", "prep is gone")
        assert c.fail_waiting_replays() == []  # failed; nothing ran to abort
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "prep"
        assert "no replica left to replay it on" in str(error)
        assert_holds_nothing(c)

    run(body)


def test_a_caller_that_reads_only_results_is_replayed_after_chunks_and_a_partial_result() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=1)
        admitted = c.admit(0.0, None, "r1")
        c.commit(admitted, {"in": 1}, stream=False)
        c.terminal_output("r1", "text", 0, False, "hel")
        c.terminal_output("r1", "text", 1, True, "hello")  # one terminal done, the other still running
        assert admitted.record.inputs == {"in": 1}  # still held: the caller has seen nothing
        voice = f"voice#{admitted.context.replicas['voice']}"
        death = c.process_died(voice, "killed by SIGKILL")
        assert death.replayed == [Replayed("r1", "tts", 1)] and admitted.record.results == {}
        assert admitted.record.expected == {"text", "tts"}
        (replay,) = c.take_replays()
        c.terminal_output("r1~1", "text", 0, True, "hello")
        c.terminal_output("r1~1", "tts", 0, True, b"wav")
        assert await asyncio.wait_for(admitted.record.outcome, 1) == {"text": "hello", "tts": b"wav"}

    run(body)


def test_a_new_replica_takes_the_newest_of_the_backlog_that_showed_nothing_to_its_caller() -> None:
    async def body() -> None:
        c, _ = core()  # moving is not a replay: no replay limit needed
        c.unresponsive = frozenset({"voice#1"})  # as if voice#1 were not up yet: everything on voice#0
        records = {rid: started(c, rid).record for rid in ("a", "b", "c", "d", "e")}
        c.terminal_output("e", "text", 0, False, "seen")  # e's caller saw output: it stays
        c.unresponsive = frozenset()
        broadcasts, moved = c.rebalance("voice#1")
        assert moved == ["c", "d"]  # 5 on one replica, share 3: the two newest that can move
        assert broadcasts == [m.Abort(("c",)), m.Abort(("d",))]
        assert [a.context.request_id for a in c.take_replays()] == ["c~0", "d~0"]
        assert {rid: c.placement._assigned[rid]["voice"] for rid in records} == {
            "a": "voice#0", "b": "voice#0", "c": "voice#1", "d": "voice#1", "e": "voice#0"}
        assert all(r.replays == 0 for r in records.values()) and c.replayed == 0

    run(body)


ELASTIC = TOPOLOGY.replace("voice: {replicas: 2}", "voice: {replicas: {min: 1, max: 4}}")


def test_replicas_coming_up_one_after_another_each_take_their_share_and_no_request_moves_twice() -> None:
    async def body() -> None:
        c = CoordinatorCore(loads(ELASTIC), request_timeout=10.0)
        ids = "abcdefghijkl"
        records = {rid: started(c, rid).record for rid in ids}  # 12 on voice#0, the one running
        assert {c.placement._assigned[rid]["voice"] for rid in ids} == {"voice#0"}
        placed: dict[str, str] = {}
        starting = {"voice#1", "voice#2", "voice#3"}  # one scale-up decision started all three
        for instance in ("voice#1", "voice#2", "voice#3"):
            starting.discard(instance)
            c.replica_added(instance)
            _, moved = c.rebalance(instance, starting)
            replays = c.take_replays()
            assert [a.context.request_id for a in replays] == [f"{rid}~0" for rid in moved]
            placed.update({rid: c.placement._assigned[rid]["voice"] for rid in moved})
        # each took its share, 12 / 4, the newest of voice#0's backlog; none was taken twice
        assert placed == {**dict.fromkeys("jkl", "voice#1"), **dict.fromkeys("ghi", "voice#2"),
                          **dict.fromkeys("def", "voice#3")}
        assert {c.placement._assigned[rid]["voice"] for rid in "abc"} == {"voice#0"}
        assert c.placement.in_flight == dict.fromkeys(("voice#0", "voice#1", "voice#2", "voice#3"), 3) | {
            "prep": 12, "brain": 12}
        # the old attempt of a moved request cannot reach its caller; the new one does
        c.terminal_output("l", "text", 0, True, "stale")
        c.terminal_output("l", "tts", 0, True, b"stale")
        assert not records["l"].finished
        c.terminal_output("l~0", "text", 0, True, "hello")
        c.terminal_output("l~0", "tts", 0, True, b"wav")
        assert await asyncio.wait_for(records["l"].outcome, 1) == {"text": "hello", "tts": b"wav"}
        assert c.replayed == 0

    run(body)


def test_a_new_replica_takes_its_share_evenly_from_the_replicas_holding_most() -> None:
    async def body() -> None:
        c = CoordinatorCore(loads(ELASTIC), request_timeout=10.0)
        c.replica_added("voice#1")
        ids = [f"r{i:02d}" for i in range(14)]
        for rid in ids:
            started(c, rid)
        assert (c.placement.in_flight["voice#0"], c.placement.in_flight["voice#1"]) == (7, 7)
        c.replica_added("voice#2")
        # share: 14 over four replicas (voice#3 still starting) is 4; each of the two holds 3
        # past it, and the most-loaded gives first, so they give two each: their two newest
        _, moved = c.rebalance("voice#2", {"voice#3"})
        assert moved == ["r10", "r11", "r12", "r13"]
        assert [a.context.request_id for a in c.take_replays()] == [f"{rid}~0" for rid in moved]
        assert {rid: c.placement._assigned[rid]["voice"] for rid in moved} == dict.fromkeys(moved, "voice#2")
        assert (c.placement.in_flight["voice#0"], c.placement.in_flight["voice#1"]) == (5, 5)

    run(body)


def test_a_new_replica_takes_fewer_than_its_share_when_the_rest_showed_their_callers_output() -> None:
    async def body() -> None:
        c = CoordinatorCore(loads(ELASTIC), request_timeout=10.0)
        for rid in "abcde":
            started(c, rid)
        for rid in "abcd":
            c.terminal_output(rid, "text", 0, False, "seen")
        c.replica_added("voice#1")
        broadcasts, moved = c.rebalance("voice#1")
        assert moved == ["e"] and broadcasts == [m.Abort(("e",))]  # share 3, only one could move

    run(body)


def test_a_moved_request_aborted_before_its_new_replica_takes_it_is_not_placed() -> None:
    async def body() -> None:
        c = CoordinatorCore(loads(ELASTIC), request_timeout=10.0)
        for rid in "abcd":
            started(c, rid)
        c.replica_added("voice#1")
        _, moved = c.rebalance("voice#1")
        assert moved == ["c", "d"]
        assert c.abort("d") == []  # no attempt runs while it waits: nothing to broadcast
        assert [a.context.request_id for a in c.take_replays()] == ["c~0"]
        assert c.held()["replays_waiting"] == 0 and "d" not in c._targets

    run(body)


def test_a_caller_that_streamed_autoregressive_tokens_resumes_with_them_forced() -> None:
    from omnictl.outputs import TokenDelta

    async def body() -> None:
        c, _ = core(replay_limit=1)
        admitted = started(c, "r1", ["text"])  # prep and brain: the text terminal alone
        c.terminal_output("r1", "text", 0, False, TokenDelta(text="he", token_ids=[104, 101]))
        c.terminal_output("r1", "text", 1, False, TokenDelta(text="l", token_ids=[108]))
        death = c.process_died("brain", "killed by SIGKILL")
        assert death.replayed == [Replayed("r1", "thinker", 1, resumed=True)] and death.failed == []
        c.process_back("brain", death.dropped)
        (replay,) = c.take_replays()
        assert replay.context.params[m.RESUME_PARAM] == {"text": [104, 101, 108]}
        c.terminal_output("r1~1", "text", 0, False, TokenDelta(text="lo", token_ids=[108, 111]))
        assert admitted.record.sent_tokens == {"text": [104, 101, 108, 108, 111]}  # a second resume has them all
        assert (c.replayed, c.resumed) == (1, 1)
        # a chunk that is not an autoregressive increment: nothing to force, it fails
        other = started(c, "r2", ["text"])
        c.terminal_output("r2", "text", 0, False, {"text": "he"})
        c.process_died("brain", "killed by SIGKILL")
        error = other.record.outcome.exception()
        assert isinstance(error, RequestFailed) and "it cannot resume from" in str(error)

    run(body)


# --- streamed input -------------------------------------------------------------------


def streaming(c: CoordinatorCore, request_id: str, now: float = 0.0) -> Admitted:
    admitted = c.admit(now, None, request_id)
    c.commit(admitted, None, input_stream=True)  # the shell sends a first chunk, if any, by next_chunk
    return admitted


def test_a_streamed_input_counts_its_chunks_and_is_refused_once_ended() -> None:
    async def body() -> None:
        c, _ = core()
        admitted = streaming(c, "r1")
        record = admitted.record
        assert record.inputs is None  # no chunk is kept for a replay
        stream = record.input_stream
        assert stream is not None and (stream.entry, stream.instance) == ("prep", "prep")
        assert stream.context == admitted.context
        assert [c.next_chunk(record, {"n": n}) for n in range(3)] == [(stream, 0), (stream, 1), (stream, 2)]
        assert c.end_input(record) is stream and stream.ended and stream.sent == 3
        with pytest.raises(InvalidRequest, match=r"^request r1 ended: no more input is taken$") as error:
            c.next_chunk(record, {"n": 3})
        assert error.value.field == "input"
        with pytest.raises(InvalidRequest, match="request r1 ended"):
            c.end_input(record)
        assert stream.sent == 3  # a refused chunk takes no seq

    run(body())


def test_a_whole_input_takes_no_chunk_and_a_finished_stream_none_either() -> None:
    async def body() -> None:
        c, _ = core()
        whole = started(c, "r1").record
        with pytest.raises(InvalidRequest, match=r"^request r1 takes no streamed input: no more input is taken$"):
            c.next_chunk(whole, {"n": 0})
        record = streaming(c, "r2").record
        assert c.abort("r2") == [m.Abort(("r2",))]
        with pytest.raises(InvalidRequest, match=r"^request r2 has ended: no more input is taken$"):
            c.next_chunk(record, {"n": 0})
        c.abort("r1")
        assert_holds_nothing(c)

    run(body())


def test_a_streamed_input_never_ended_fails_at_its_deadline_naming_the_chunks_it_got() -> None:
    async def body() -> None:
        c, rec = core(request_timeout=5.0)
        admitted = streaming(c, "r1", now=0.0)
        c.next_chunk(admitted.record, {"n": 0})
        assert c.expire(4.9) == []
        assert c.expire(5.0) == [m.Abort(("r1",))]
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed)
        assert str(error) == "request r1 missed its deadline of 5s; its input was never ended (1 chunk(s) received)"
        assert_holds_nothing(c)
        # once ended, the deadline names the terminals it waits for, as for any request
        ended = streaming(c, "r2", now=10.0)
        c.end_input(ended.record)
        c.expire(15.0)
        assert "terminals still expected: ['text', 'tts']" in str(ended.record.outcome.exception())

    run(body())


def test_a_death_replays_a_streamed_input_from_its_kept_chunks_until_its_caller_sees_output() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=1)
        admitted = streaming(c, "r1")
        record = admitted.record
        assert record.inputs == []  # the chunks are kept while a replay could need them
        c.next_chunk(record, "a")
        c.next_chunk(record, "b")
        instance = f"voice#{admitted.context.replicas['voice']}"
        death = c.process_died(instance, "killed by SIGKILL")
        assert death.failed == [] and [r.request_id for r in death.replayed] == ["r1"]
        assert death.broadcasts[0] == m.Abort(("r1",))
        # while it waits for a replica, chunks (and the end) are kept, not sent
        assert c.next_chunk(record, "c") is None and c.end_input(record) is None
        (replay,) = c.take_replays()
        stream = record.input_stream
        assert stream is not None and stream.context == replay.context and stream.instance == replay.instance
        assert replay.context.request_id == "r1~1" and record.inputs == ["a", "b", "c"] and stream.sent == 3
        # once the caller has seen output (audio, not a token stream), a death fails it
        c.terminal_output("r1~1", "tts", 0, False, {"audio": 1})
        assert record.inputs is None
        death = c.process_died(f"voice#{replay.context.replicas['voice']}", "killed by SIGKILL")
        assert death.failed == ["r1"]
        assert "not replayed: its caller already received output" in str(record.outcome.exception())

    run(body())


def test_with_replays_off_a_streamed_input_keeps_no_chunk_and_a_death_fails_it() -> None:
    async def body() -> None:
        c, _ = core(replay_limit=0)
        admitted = streaming(c, "r1")
        c.next_chunk(admitted.record, "a")
        assert admitted.record.inputs is None
        death = c.process_died("prep", "killed by SIGKILL")
        assert death.failed == ["r1"] and death.replayed == []
        error = admitted.record.outcome.exception()
        assert isinstance(error, RequestFailed) and error.stage == "prep"

    run(body())
