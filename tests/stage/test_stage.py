"""The Stage alone, with a recording profiler and ports that collect what it sends
(test doubles for its two neighbours; the scheduler is the real simple scheduler)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from omnictl.exceptions import InvalidRequest
from omnictl.messages import INPUT_SOURCE, RequestContext
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import IncomingKind
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Stage
from omnictl.topology.model import RelayKnobs, StageSpec


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[EventKind, str, str | None]] = []

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: Any) -> None:
        self.events.append((kind, request_id, stage))


class Sent:
    def __init__(self) -> None:
        self.data: list[tuple[str, str, Any]] = []
        self.skips: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str]] = []
        self.done = asyncio.Event()

    def send_data(self, ctx: RequestContext, src: str, dst: str, data: Any) -> None:
        self.data.append((ctx.request_id, dst, data))
        self.done.set()

    def send_skip(self, ctx: RequestContext, src: str, dst: str) -> None:
        self.skips.append((ctx.request_id, dst))

    def send_failure(self, request_id: str, stage: str, error: str, field: str | None = None) -> None:
        self.failures.append((request_id, error))
        self.done.set()

    def send_stream(self, *args: Any) -> None: ...
    def send_stream_done(self, *args: Any) -> None: ...
    def send_terminal(self, *args: Any) -> None: ...
    def send_terminal_skipped(self, *args: Any) -> None: ...


def join_stage(profiler: Recorder, sent: Sent) -> Stage:
    spec = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("left", "right"), merge_fn="x.merge")
    fanin = FanIn(("left", "right"), lambda inputs: {"from": sorted(inputs)})
    return Stage(spec, SimpleScheduler(lambda data: data), fanin, Router(spec, None, {}), sent, profiler)  # type: ignore[arg-type]


def test_a_skipped_branch_ends_the_fan_in_wait_and_runs_the_stage() -> None:
    profiler, sent = Recorder(), Sent()
    ctx = RequestContext("r1", {}, ("left", "right", "join", "out"))

    async def go() -> None:
        stage = join_stage(profiler, sent)
        await stage.start()
        stage.on_input(ctx, "left", {"x": 1})
        stage.on_skip(ctx, "right")
        await asyncio.wait_for(sent.done.wait(), 5)
        await stage.stop()

    asyncio.run(go())
    assert sent.data == [("r1", "out", {"from": ["left"]})]
    kinds = [kind for kind, _, _ in profiler.events]
    assert kinds.index(EventKind.FANIN_WAIT_START) < kinds.index(EventKind.FANIN_WAIT_END) < kinds.index(EventKind.QUEUE_ENTER)


def test_a_stage_whose_upstreams_are_all_skipped_skips_downstream() -> None:
    profiler, sent = Recorder(), Sent()
    ctx = RequestContext("r2", {}, ("left", "right", "join", "out"))

    async def go() -> None:
        stage = join_stage(profiler, sent)
        await stage.start()
        stage.on_skip(ctx, "left")
        stage.on_skip(ctx, "right")
        await stage.stop()
        assert stage.stats(0).requests == 0

    asyncio.run(go())
    assert sent.skips == [("r2", "out")] and sent.data == []


# --- abort and skip purge what the stage holds for one request, and only that --------
# The stage is never started: nothing takes from the scheduler's inbox, so what the
# stage queued is still there to look at, and no event-loop ordering is involved.

STREAMED = ("thinker", "talker", "voc", "out")  # voc: data from thinker, a stream from talker


def streamed_stage(sent: Sent) -> Stage:
    spec = StageSpec(name="voc", factory="x.y", next=("out",))
    return Stage(spec, SimpleScheduler(lambda data: data), FanIn(("thinker",), None), Router(spec, None, {}),
                 sent, Recorder())  # type: ignore[arg-type]


def queue_two_streams(stage: Stage) -> None:
    for seq in (0, 1):
        for rid in ("r1", "r2"):
            stage.on_stream_chunk(RequestContext(rid, {}, STREAMED), "talker", seq, {rid: seq})


def inbox(stage: Stage) -> list[tuple[str, Any]]:
    """Empties the (never started) scheduler's inbox: (request id, data) in queue order."""
    queue = stage.scheduler.inbox
    return [(m.request_id, m.data) for m in (queue.get_nowait() for _ in range(queue.qsize()))]


def test_abort_leaves_only_the_other_requests_messages_and_state() -> None:
    stage = streamed_stage(Sent())
    queue_two_streams(stage)
    assert (stage.stats(0).requests, stage.stats(0).queued, stage.stats(0).stream_buffers) == (2, 4, 2)
    stage.on_abort("r1")
    stats = stage.stats(0)
    assert (stats.requests, stats.queued, stats.stream_buffers, stats.fanin_buffers) == (1, 2, 1, 0)
    # A message for r1 still in flight when it was aborted is dropped, not started again.
    stage.on_stream_chunk(RequestContext("r1", {}, STREAMED), "talker", 2, {"r1": 2})
    stage.on_input(RequestContext("r1", {}, STREAMED), "thinker", {"late": True})
    assert inbox(stage) == [("r2", {"r2": 0}), ("r2", {"r2": 1})]


def test_a_stream_s_end_reaches_the_scheduler_whole_and_leaves_no_stream_buffer() -> None:
    stage = streamed_stage(Sent())
    stage.on_stream_chunk(RequestContext("r1", {"voice": "zed"}, STREAMED), "talker", 0, {"r1": 0})
    assert stage.stats(0).stream_buffers == 1
    stage.on_stream_done(RequestContext("r1", {"voice": "zed"}, STREAMED), "talker")
    assert stage.stats(0).stream_buffers == 0
    queue = stage.scheduler.inbox
    chunk, done = (queue.get_nowait() for _ in range(queue.qsize()))
    assert (chunk.kind, chunk.source, chunk.data) == (IncomingKind.STREAM_CHUNK, "talker", {"r1": 0})
    assert (done.kind, done.request_id, done.data, done.source, done.params) == (
        IncomingKind.STREAM_DONE, "r1", None, "talker", {"voice": "zed"})


def test_abort_drops_a_half_gathered_fan_in() -> None:
    stage = join_stage(Recorder(), Sent())
    for rid in ("r1", "r2"):
        stage.on_input(RequestContext(rid, {}, ("left", "right", "join", "out")), "left", {"x": rid})
    assert (stage.stats(0).requests, stage.stats(0).fanin_buffers) == (2, 2)
    stage.on_abort("r1")
    assert (stage.stats(0).requests, stage.stats(0).fanin_buffers, stage.stats(0).queued) == (1, 1, 0)
    # r1's other half arriving late does not complete (or restart) it.
    stage.on_input(RequestContext("r1", {}, ("left", "right", "join", "out")), "right", {"x": "r1"})
    assert stage.stats(0).queued == 0
    stage.on_input(RequestContext("r2", {}, ("left", "right", "join", "out")), "right", {"x": "r2"})
    assert inbox(stage) == [("r2", {"from": ["left", "right"]})]


def test_a_skip_purges_the_stream_it_was_fed_and_skips_downstream() -> None:
    # The route_fn upstream of voc left it out for r1 after talker had already streamed to it.
    sent = Sent()
    stage = streamed_stage(sent)
    queue_two_streams(stage)
    stage.on_skip(RequestContext("r1", {}, STREAMED), "thinker")
    assert sent.skips == [("r1", "out")]
    stats = stage.stats(0)
    assert (stats.requests, stats.queued, stats.stream_buffers) == (1, 2, 1)
    stage.on_stream_chunk(RequestContext("r1", {}, STREAMED), "talker", 2, {"r1": 2})
    assert inbox(stage) == [("r2", {"r2": 0}), ("r2", {"r2": 1})]


class FailurePorts(Sent):
    """Records each failure with the field at fault, and what a non-terminal stage sends on."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[str | None] = []

    def send_failure(self, request_id: str, stage: str, error: str, field: str | None = None) -> None:
        self.fields.append(field)
        super().send_failure(request_id, stage, error, field)


def one_stage(fn: Any, sent: Sent, name: str = "s", terminal: bool = False) -> Stage:
    spec = StageSpec(name=name, factory="x.y", next=() if terminal else ("out",), terminal=terminal)
    return Stage(spec, SimpleScheduler(fn), FanIn((), None), Router(spec, None, {}), sent, Recorder())  # type: ignore[arg-type]


def run_one(stage: Stage, sent: Sent, data: Any, rid: str = "r1") -> None:
    async def scenario() -> None:
        await stage.start()
        try:
            stage.on_input(RequestContext(rid, {}, (stage.name, "out")), None, data)
            await asyncio.wait_for(sent.done.wait(), 10)
        finally:
            await stage.stop()

    asyncio.run(scenario())


def test_a_bad_input_is_reported_with_its_field_and_logged_once_as_the_client_s_mistake(
        caplog: pytest.LogCaptureFixture) -> None:
    def refuse(data: Any) -> Any:
        raise InvalidRequest("messages[0].content: must be text", field="messages[0].content")

    sent = FailurePorts()
    caplog.set_level(logging.INFO, logger="omnictl.stage.stage")
    run_one(one_stage(refuse, sent), sent, {"x": 1})
    assert sent.fields == ["messages[0].content"] and [rid for rid, _ in sent.failures] == ["r1"]
    records = [r for r in caplog.records if r.name == "omnictl.stage.stage"]
    assert [(r.levelno, r.request_id, r.exc_info) for r in records] == [(logging.INFO, "r1", None)]  # type: ignore[attr-defined]
    assert records[0].getMessage() == f"{sent.failures[0][1]} (field messages[0].content)"  # what was reported


def test_a_stage_s_own_failure_is_logged_once_as_an_error_with_its_traceback_and_request_id(
        caplog: pytest.LogCaptureFixture) -> None:
    def crash(data: Any) -> Any:
        raise RuntimeError("the model fell over")

    sent = FailurePorts()
    caplog.set_level(logging.INFO, logger="omnictl.stage.stage")
    run_one(one_stage(crash, sent), sent, {"x": 1}, rid="r7")
    assert sent.fields == [None] and sent.failures[0][0] == "r7" and "the model fell over" in sent.failures[0][1]
    records = [r for r in caplog.records if r.name == "omnictl.stage.stage"]
    assert len(records) == 1 and records[0].levelno == logging.ERROR and records[0].request_id == "r7"  # type: ignore[attr-defined]
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError  # where it happened
    assert records[0].getMessage() == sent.failures[0][1]  # the log says what the coordinator was told


def test_a_non_terminal_stage_named_like_a_modality_is_not_held_to_that_terminal_contract() -> None:
    sent = Sent()
    run_one(one_stage(lambda data: {"any": "dict"}, sent, name="text"), sent, {"x": 1})
    assert sent.failures == [] and sent.data == [("r1", "out", {"any": "dict"})]


def test_stats_show_how_long_the_running_step_has_run_in_milliseconds() -> None:
    started = threading.Event()

    def slow(data: Any) -> Any:
        started.set()
        time.sleep(0.4)
        return data

    sent = Sent()
    stage = one_stage(slow, sent)

    async def scenario() -> tuple[Any, Any, Any]:
        await stage.start()
        try:
            idle = stage.stats(0)
            stage.on_input(RequestContext("r1", {}, ("s", "out")), None, {"x": 1})
            await asyncio.to_thread(started.wait, 10)
            await asyncio.sleep(0.15)
            busy = stage.stats(2)
            await asyncio.wait_for(sent.done.wait(), 10)
            for _ in range(200):  # the output may reach the loop before the worker thread leaves the step
                if not stage.stats(0).running:
                    break
                await asyncio.sleep(0.01)
            return idle, busy, stage.stats(0)
        finally:
            await stage.stop()

    idle, busy, after = asyncio.run(scenario())
    assert idle.busy_s == 0.0 and after.busy_s == 0.0 and after.requests == 0
    assert 0.1 <= busy.busy_s < 0.4 and busy.busy_s == round(busy.busy_s, 3), busy
    assert (busy.requests, busy.running, busy.slots_in_use) == (1, 1, 2)


def test_a_route_fn_that_raises_fails_the_request_and_logs_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def route(data: Any) -> list[str]:
        raise KeyError("no such branch")

    sent = Sent()
    spec = StageSpec(name="s", factory="x.y", next=("out", "other"), route_fn="x.route")
    stage = Stage(spec, SimpleScheduler(lambda data: data), FanIn((), None), Router(spec, route, {}), sent, Recorder())  # type: ignore[arg-type]
    run_one(stage, sent, {"x": 1})
    assert sent.data == [] and sent.failures[0][0] == "r1" and "routing in stage 's' raised" in sent.failures[0][1]
    [record] = [r for r in caplog.records if r.name == "omnictl.stage.stage"]
    assert record.levelno == logging.ERROR and record.exc_info is not None and record.exc_info[0] is KeyError


def test_the_inbox_reports_full_once_at_its_limit_and_room_again_once_it_drains() -> None:
    """relay.inbox=2: one request running and two waiting is full (the coordinator then holds
    admission); one waiting is not. Each change is told once."""
    gate, started = threading.Event(), threading.Event()

    def held(data: Any) -> Any:
        started.set()
        gate.wait(10)
        return data

    sent = Sent()
    spec = StageSpec(name="s", factory="x.y", next=("out",), relay=RelayKnobs(inbox=2))
    stage = Stage(spec, SimpleScheduler(held), FanIn((), None), Router(spec, None, {}), sent, Recorder())  # type: ignore[arg-type]
    told: list[tuple[str, bool]] = []
    stage.on_inbox = lambda name, full: told.append((name, full))

    def submit(rid: str) -> None:
        stage.on_input(RequestContext(rid, {}, ("s", "out")), None, {"rid": rid})

    async def scenario() -> list[list[tuple[str, bool]]]:
        await stage.start()
        seen = []
        try:
            submit("r1")
            await asyncio.to_thread(started.wait, 10)  # r1 runs; the next ones wait
            submit("r2")
            seen.append(list(told))
            submit("r3")
            seen.append(list(told))
            stage.check_inbox()  # the worker's poll: no change, nothing told
            seen.append(list(told))
            gate.set()
            for _ in range(500):
                if len(sent.data) == 3:
                    break
                await asyncio.sleep(0.01)
            stage.check_inbox()
            seen.append(list(told))
        finally:
            gate.set()
            await stage.stop()
        return seen

    one_waiting, two_waiting, polled, drained = asyncio.run(scenario())
    assert one_waiting == [] and two_waiting == [("s", True)] and polled == [("s", True)]
    assert drained == [("s", True), ("s", False)] and len(sent.data) == 3
    assert stage.inbox_full() is False


def test_a_merge_fn_that_raises_fails_the_request_and_logs_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def merge(inputs: dict[str, Any]) -> Any:
        raise ValueError("halves do not fit")

    sent = Sent()
    spec = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("left", "right"), merge_fn="x.merge")
    stage = Stage(spec, SimpleScheduler(lambda data: data), FanIn(("left", "right"), merge), Router(spec, None, {}),
                  sent, Recorder())  # type: ignore[arg-type]
    ctx = RequestContext("r1", {}, ("left", "right", "join", "out"))
    stage.on_input(ctx, "left", 1)
    stage.on_input(ctx, "right", 2)
    assert sent.failures and sent.failures[0][0] == "r1" and "merge_fn of stage 'join' raised" in sent.failures[0][1]
    [record] = [r for r in caplog.records if r.name == "omnictl.stage.stage"]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert stage.stats(0).requests == 0 and stage.stats(0).fanin_buffers == 0


class Unsendable(Sent):
    def send_data(self, ctx: RequestContext, src: str, dst: str, data: Any) -> None:
        raise TypeError("cannot serialize a socket")


def test_an_output_that_cannot_be_sent_fails_its_request_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    sent = Unsendable()
    run_one(one_stage(lambda data: data, sent), sent, {"x": 1})
    assert "stage 's' could not send its output: TypeError: cannot serialize a socket" in sent.failures[0][1]
    [record] = [r for r in caplog.records if r.name == "omnictl.stage.stage"]
    assert record.levelno == logging.ERROR and record.exc_info is not None and record.exc_info[0] is TypeError


def test_a_three_way_fan_in_records_its_wait_once_from_the_first_part_to_the_last() -> None:
    profiler, sent = Recorder(), Sent()
    spec = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("a", "b", "c"), merge_fn="x.merge")
    stage = Stage(spec, SimpleScheduler(lambda data: data), FanIn(("a", "b", "c"), lambda inputs: sorted(inputs)),
                  Router(spec, None, {}), sent, profiler)  # type: ignore[arg-type]
    ctx = RequestContext("r1", {}, ("a", "b", "c", "join", "out"))
    waits = []
    for source in ("a", "b", "c"):
        stage.on_input(ctx, source, source)
        waits.append([kind for kind, _, _ in profiler.events if kind in (EventKind.FANIN_WAIT_START, EventKind.FANIN_WAIT_END)])
    assert waits == [[EventKind.FANIN_WAIT_START]] * 2 + [[EventKind.FANIN_WAIT_START, EventKind.FANIN_WAIT_END]]


def test_a_streamed_input_reaches_the_entry_s_scheduler_in_order_as_the_objects_sent() -> None:
    # Inside one process a chunk is the object itself (no codec): the entry's scheduler gets
    # each one, in order, then the end, from the caller's source, with the request's params.
    spec = StageSpec(name="entry", factory="x.y", next=("out",))
    stage = Stage(spec, SimpleScheduler(lambda data: data), FanIn((), None), Router(spec, None, {}), Sent(),
                  Recorder())  # type: ignore[arg-type]
    ctx = RequestContext("r1", {"voice": "zed"}, ("entry", "out"))
    chunks = [{"i": i} for i in range(5)]
    for seq, chunk in enumerate(chunks):
        stage.on_stream_chunk(ctx, INPUT_SOURCE, seq, chunk)
    stage.on_stream_done(ctx, INPUT_SOURCE)
    queue = stage.scheduler.inbox
    messages = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [message.kind for message in messages] == [IncomingKind.STREAM_CHUNK] * 5 + [IncomingKind.STREAM_DONE]
    assert all(got.data is sent for got, sent in zip(messages, chunks))
    assert {(message.source, message.request_id) for message in messages} == {(INPUT_SOURCE, "r1")}
    assert all(message.params == {"voice": "zed"} for message in messages)
    assert stage.stats(0).stream_buffers == 0  # the end closed the input's stream here
