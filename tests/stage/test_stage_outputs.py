"""What a Stage does with what its scheduler puts out: STREAM to stream_to targets, ROUTE a
result, report a terminal's outputs, fail one request, and what it records on the way.

The scheduler takes nothing from its inbox: the test emits outgoing messages, as a
scheduler would, and the started Stage gets each (``scheduler.deliver``). The
ports and the profiler are test doubles that record every call in order.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from omnictl.messages import RequestContext
from omnictl.outputs import TextDelta, TextResult
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import OutgoingKind, OutgoingMessage, SchedulerLoad
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Stage
from omnictl.topology.model import StageSpec
from tests.support.profiler import RecordingProfiler


class Ports:
    """Every call, in order, as a tuple naming the port."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse_data = False  # send_data raises, as an unserializable output would

    def send_data(self, ctx: RequestContext, src: str, dst: str, data: Any) -> None:
        if self.refuse_data:
            raise TypeError("cannot pickle 'generator' object")
        self.calls.append(("data", ctx.request_id, src, dst, data))

    def send_stream(self, ctx: RequestContext, src: str, dst: str, seq: int, data: Any) -> None:
        self.calls.append(("stream", ctx.request_id, src, dst, seq, data))

    def send_stream_done(self, ctx: RequestContext, src: str, dst: str) -> None:
        self.calls.append(("stream_done", ctx.request_id, src, dst))

    def send_skip(self, ctx: RequestContext, src: str, dst: str) -> None:
        self.calls.append(("skip", ctx.request_id, src, dst))

    def send_terminal(self, request_id: str, stage: str, final: bool, seq: int, data: Any) -> None:
        self.calls.append(("terminal", request_id, stage, final, seq, data))

    def send_terminal_skipped(self, request_id: str, stage: str) -> None:
        self.calls.append(("terminal_skipped", request_id, stage))

    def send_failure(self, request_id: str, stage: str, error: str, rejected: bool = False,
                     field: str | None = None) -> None:
        self.calls.append(("failure", request_id, stage, error) + ((field,) if field is not None else ()))


class Idle(SimpleScheduler):
    """Takes nothing from its inbox: what comes out is what the test puts on the outbox."""

    def __init__(self) -> None:
        super().__init__(lambda data: data)
        self.aborted: list[str] = []

    async def run(self) -> None:
        await asyncio.Event().wait()

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def make_stage(spec: StageSpec, route_fn: Callable[[Any], Any] | None = None,
               projections: dict[str, Callable[[Any], Any]] | None = None) -> tuple[Stage, Ports, RecordingProfiler]:
    ports, profiler = Ports(), RecordingProfiler()
    stage = Stage(spec, Idle(), FanIn((), None), Router(spec, route_fn, projections or {}),
                  ports, profiler)  # type: ignore[arg-type]
    return stage, ports, profiler


async def emitted(stage: Stage, *messages: OutgoingMessage) -> None:
    """Emit ``messages`` and let the stage handle every one (each is delivered in a loop
    callback of its own, all run by the next loop iteration)."""
    for message in messages:
        stage.scheduler.emit(message)
    await asyncio.sleep(0)
    assert stage.scheduler.outbox.empty()  # delivered to the stage, not queued


def run(stage: Stage, body: Callable[[], Awaitable[None]]) -> None:
    async def go() -> None:
        await stage.start()
        try:
            await body()
        finally:
            await stage.stop()

    asyncio.run(asyncio.wait_for(go(), 10))


def admit(stage: Stage, rid: str, active: tuple[str, ...]) -> None:
    """Give the stage ``rid``'s input (queued, never run) and forget what that recorded."""
    stage.on_input(RequestContext(rid, {"voice": "v"}, active), "up", {})
    assert isinstance(stage.profiler, RecordingProfiler)
    stage.profiler.events.clear()


def stream(rid: str, data: Any) -> OutgoingMessage:
    return OutgoingMessage(OutgoingKind.STREAM, rid, data)


def result(rid: str, data: Any) -> OutgoingMessage:
    return OutgoingMessage(OutgoingKind.RESULT, rid, data)


THINKER = StageSpec(name="thinker", factory="x.y", next=("decode", "talker"), stream_to=("decode", "talker"))


def test_chunks_stream_to_active_targets_in_order_then_the_result_ends_the_streams_and_routes() -> None:
    stage, ports, profiler = make_stage(THINKER)
    assert (stage.scheduler.stage_name, stage.scheduler.profiler) == ("thinker", profiler)  # its errors name the stage

    async def body() -> None:
        admit(stage, "r", ("thinker", "decode"))  # text only: the talker was pruned
        await emitted(stage, stream("r", {"t": 1}), stream("r", {"t": 2}), result("r", {"all": [1, 2]}))

    run(stage, body)
    assert ports.calls == [
        ("stream", "r", "thinker", "decode", 0, {"t": 1}),
        ("stream", "r", "thinker", "decode", 1, {"t": 2}),
        ("stream_done", "r", "thinker", "decode"),
        ("data", "r", "thinker", "decode", {"all": [1, 2]}),
    ]
    assert [(k, rid, s) for k, rid, s, _ in profiler.events] == [
        (EventKind.FIRST_EMIT, "r", "thinker"), (EventKind.STAGE_DONE, "r", "thinker")]
    assert stage.stats(0).requests == 0  # forgotten once routed


def test_a_fan_out_gives_each_target_its_own_containers_and_projections_their_part() -> None:
    spec = StageSpec(name="thinker", factory="x.y", next=("decode", "talker"))
    stage, ports, _ = make_stage(spec, projections={"talker": lambda d: {"ids": d["ids"]}})
    data = {"ids": [1, 2], "hidden": "big"}

    async def body() -> None:
        admit(stage, "r", ("thinker", "decode", "talker"))
        await emitted(stage, result("r", data))

    run(stage, body)
    sent = {call[3]: call[4] for call in ports.calls}
    assert list(sent) == ["decode", "talker"]
    assert sent == {"decode": data, "talker": {"ids": [1, 2]}}
    assert sent["decode"] is not data and sent["decode"]["ids"] is not data["ids"]
    assert sent["talker"]["ids"] is not data["ids"]  # the projection got a copy too


def test_a_single_target_gets_the_object_itself() -> None:
    spec = StageSpec(name="a", factory="x.y", next=("b",))
    stage, ports, _ = make_stage(spec)
    data = {"x": [1]}

    async def body() -> None:
        admit(stage, "r", ("a", "b"))
        await emitted(stage, result("r", data))

    run(stage, body)
    assert ports.calls == [("data", "r", "a", "b", data)] and ports.calls[0][4] is data


def test_a_route_fn_choice_skips_the_candidates_left_out() -> None:
    spec = StageSpec(name="r", factory="x.y", next=("audio", "video", "text"), route_fn="x.route")
    stage, ports, _ = make_stage(spec, route_fn=lambda data: data["to"])

    async def body() -> None:
        admit(stage, "q", ("r", "audio", "video", "text"))
        await emitted(stage, result("q", {"to": "video"}))

    run(stage, body)
    assert ports.calls == [("skip", "q", "r", "audio"), ("skip", "q", "r", "text"), ("data", "q", "r", "video", {"to": "video"})]


@pytest.mark.parametrize(("route_fn", "error"), [
    (lambda data: [], "route_fn of stage 'r' returned []; it must return one or more of ['a', 'b']"),
    (lambda data: data["missing"], "routing in stage 'r' raised KeyError: 'missing' (at "),
])
def test_a_broken_route_fails_only_that_request_and_sends_nothing(route_fn: Callable[[Any], Any], error: str) -> None:
    spec = StageSpec(name="r", factory="x.y", next=("a", "b"), route_fn="x.route")
    stage, ports, _ = make_stage(spec, route_fn=route_fn)

    async def body() -> None:
        admit(stage, "bad", ("r", "a", "b"))
        await emitted(stage, result("bad", {}))

    run(stage, body)
    [(kind, rid, where, message)] = ports.calls
    assert (kind, rid, where) == ("failure", "bad", "r") and message.startswith(error)
    assert stage.stats(0).requests == 0


def test_a_terminal_reports_each_chunk_and_then_its_result_with_the_chunk_count() -> None:
    spec = StageSpec(name="decode", factory="x.y", terminal=True, modality="text")
    stage, ports, profiler = make_stage(spec)

    async def body() -> None:
        admit(stage, "r", ("decode",))
        await emitted(stage, stream("r", TextDelta(text="a")))
        assert profiler.kinds() == [EventKind.FIRST_EMIT]  # at the first chunk, not a later one
        await emitted(stage, stream("r", TextDelta(text="b")), result("r", TextResult(text="ab")))

    run(stage, body)
    assert ports.calls == [
        ("terminal", "r", "decode", False, 0, TextDelta(text="a")),
        ("terminal", "r", "decode", False, 1, TextDelta(text="b")),
        ("terminal", "r", "decode", True, 2, TextResult(text="ab")),
    ]
    assert profiler.kinds() == [EventKind.FIRST_EMIT, EventKind.STAGE_DONE]
    assert stage.stats(0).requests == 0


def test_a_terminal_that_never_streamed_reports_its_result_as_seq_0() -> None:
    spec = StageSpec(name="decode", factory="x.y", terminal=True, modality="text")
    stage, ports, _ = make_stage(spec)

    async def body() -> None:
        admit(stage, "r", ("decode",))
        await emitted(stage, result("r", TextResult(text="whole")))

    run(stage, body)
    assert ports.calls == [("terminal", "r", "decode", True, 0, TextResult(text="whole"))]


def test_a_terminal_all_of_whose_upstreams_are_skipped_says_so_and_skips_on() -> None:
    spec = StageSpec(name="tts", factory="x.y", terminal=True, modality="audio", next=("log",))
    stage, ports, profiler = make_stage(spec)
    stage.on_skip(RequestContext("r", {}, ("llm", "tts", "log")), "llm")
    assert ports.calls == [("terminal_skipped", "r", "tts"), ("skip", "r", "tts", "log")]
    assert isinstance(stage.scheduler, Idle) and stage.scheduler.aborted == ["r"]
    assert stage.stats(0).requests == 0 and profiler.events == []


def test_a_terminal_that_also_streams_on_sends_both() -> None:
    spec = StageSpec(name="decode", factory="x.y", terminal=True, modality="text", stream_to=("tts",))
    stage, ports, _ = make_stage(spec)

    async def body() -> None:
        admit(stage, "r", ("decode", "tts"))
        await emitted(stage, stream("r", TextDelta(text="a")), result("r", TextResult(text="a")))

    run(stage, body)
    assert ports.calls == [
        ("stream", "r", "decode", "tts", 0, TextDelta(text="a")),
        ("terminal", "r", "decode", False, 0, TextDelta(text="a")),
        ("stream_done", "r", "decode", "tts"),
        ("terminal", "r", "decode", True, 1, TextResult(text="a")),
    ]


def test_a_scheduler_error_fails_the_request_naming_the_stage() -> None:
    stage, ports, _ = make_stage(THINKER)

    async def body() -> None:
        admit(stage, "r", ("thinker", "decode"))
        await emitted(stage, OutgoingMessage(OutgoingKind.ERROR, "r", error="ValueError: bad token"))

    run(stage, body)
    assert ports.calls == [("failure", "r", "thinker", "stage 'thinker' failed: ValueError: bad token")]
    assert stage.stats(0).requests == 0
    assert isinstance(stage.scheduler, Idle) and stage.scheduler.aborted == ["r"]  # whatever it still holds


def test_an_output_that_cannot_be_sent_fails_its_request_and_the_stage_goes_on() -> None:
    spec = StageSpec(name="a", factory="x.y", next=("b",))
    stage, ports, _ = make_stage(spec)

    async def body() -> None:
        admit(stage, "r1", ("a", "b"))
        admit(stage, "r2", ("a", "b"))
        ports.refuse_data = True
        await emitted(stage, result("r1", {"gen": 1}))
        ports.refuse_data = False
        await emitted(stage, result("r2", {"ok": 2}))

    run(stage, body)
    assert ports.calls[0][:3] == ("failure", "r1", "a")
    assert ports.calls[0][3].startswith("stage 'a' could not send its output: TypeError: cannot pickle 'generator' object")
    assert ports.calls[1:] == [("data", "r2", "a", "b", {"ok": 2})]


def test_outputs_of_a_request_the_stage_no_longer_holds_are_dropped() -> None:
    stage, ports, profiler = make_stage(THINKER)

    async def body() -> None:
        admit(stage, "r", ("thinker", "decode"))
        stage.on_abort("r")
        stage.on_abort("never-seen")  # an abort broadcast for a request this stage never held
        await emitted(stage, stream("r", {"t": 1}), result("r", {}), OutgoingMessage(OutgoingKind.ERROR, "r", error="x"))

    run(stage, body)
    assert ports.calls == []
    # the abort is recorded once, for the request it held; the dropped outputs record nothing
    assert profiler.events == [(EventKind.STAGE_ABORTED, "r", "thinker", {})]


def test_stats_add_the_stage_s_own_state_to_the_scheduler_s_load() -> None:
    join = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("left", "right"), merge_fn="x.merge")
    ports, profiler = Ports(), RecordingProfiler()

    class Loaded(SimpleScheduler):
        def load(self) -> SchedulerLoad:
            return SchedulerLoad(queued=3, running=4, stream_buffers=5, kv_slots=6)

    stage = Stage(join, Loaded(lambda data: data), FanIn(("left", "right"), lambda inputs: inputs), Router(join, None, {}),
                  ports, profiler)  # type: ignore[arg-type]
    active = ("left", "right", "talker", "join", "out")
    stage.on_input(RequestContext("r1", {}, active), "left", {})  # waits for right
    stage.on_stream_chunk(RequestContext("r2", {}, active), "talker", 0, {})  # streaming in
    stats = stage.stats(7)
    assert (stats.requests, stats.fanin_buffers, stats.queued, stats.running, stats.stream_buffers,
            stats.kv_slots, stats.slots_in_use) == (2, 1, 3, 4, 1 + 5, 6, 7)


def test_inputs_are_recorded_with_their_source_and_a_fan_in_wait_is_bracketed() -> None:
    join = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("left", "right"), merge_fn="x.merge")
    ports, profiler = Ports(), RecordingProfiler()
    stage = Stage(join, SimpleScheduler(lambda data: data), FanIn(("left", "right"), lambda inputs: sorted(inputs)),
                  Router(join, None, {}), ports, profiler)  # type: ignore[arg-type]
    ctx = RequestContext("r", {"voice": "v"}, ("left", "right", "join", "out"))
    stage.on_input(ctx, "left", {})
    stage.on_stream_chunk(ctx, "left", 4, {})
    stage.on_input(ctx, "right", {})
    assert profiler.events == [
        (EventKind.INPUT_RECEIVED, "r", "join", {"source": "left"}),
        (EventKind.FANIN_WAIT_START, "r", "join", {}),
        (EventKind.STREAM_RECEIVED, "r", "join", {"source": "left", "seq": 4}),
        (EventKind.INPUT_RECEIVED, "r", "join", {"source": "right"}),
        (EventKind.FANIN_WAIT_END, "r", "join", {}),
        (EventKind.QUEUE_ENTER, "r", "join", {}),
    ]
    queued = [stage.scheduler.inbox.get_nowait() for _ in range(stage.scheduler.inbox.qsize())]
    assert [(m.kind.value, m.request_id, m.data, m.source, m.params) for m in queued] == [
        ("stream_chunk", "r", {}, "left", {"voice": "v"}), ("new_request", "r", ["left", "right"], "right", {"voice": "v"})]


def test_a_single_upstream_input_goes_straight_to_the_queue_with_no_fan_in_wait() -> None:
    stage, _, profiler = make_stage(StageSpec(name="a", factory="x.y", next=("b",)))
    stage.on_input(RequestContext("r", {"voice": "v"}, ("up", "a", "b")), "up", {"x": 1})
    assert profiler.kinds() == [EventKind.INPUT_RECEIVED, EventKind.QUEUE_ENTER]
    [queued] = [stage.scheduler.inbox.get_nowait() for _ in range(stage.scheduler.inbox.qsize())]
    assert (queued.data, queued.source, queued.params) == ({"x": 1}, "up", {"voice": "v"})


def test_a_merge_fn_that_raises_fails_only_that_request() -> None:
    join = StageSpec(name="join", factory="x.y", next=("out",), wait_for=("left", "right"), merge_fn="x.merge")
    ports, profiler = Ports(), RecordingProfiler()

    def merge(inputs: dict[str, Any]) -> Any:
        if "boom" in inputs["left"]:
            raise ValueError("cannot merge boom")
        return inputs

    stage = Stage(join, SimpleScheduler(lambda data: data), FanIn(("left", "right"), merge), Router(join, None, {}),
                  ports, profiler)  # type: ignore[arg-type]
    active = ("left", "right", "join", "out")
    for rid, left in (("bad", {"boom": 1}), ("good", {"fine": 1})):
        stage.on_input(RequestContext(rid, {}, active), "left", left)
        stage.on_input(RequestContext(rid, {}, active), "right", {})
    [(kind, rid, where, error)] = ports.calls
    assert (kind, rid, where) == ("failure", "bad", "join")
    assert error.startswith("merge_fn of stage 'join' raised ValueError: cannot merge boom (at ")
    assert stage.stats(0).requests == 1 and stage.stats(0).queued == 1  # only "good" runs
