"""The Stage alone, with a recording profiler and ports that collect what it sends
(test doubles for its two neighbours; the scheduler is the real simple scheduler)."""

from __future__ import annotations

import asyncio
from typing import Any

from omnictl.messages import RequestContext
from omnictl.profiling.events import EventKind
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Stage
from omnictl.topology.model import StageSpec


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
