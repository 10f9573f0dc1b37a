"""A Stage counts the caller's input chunks its scheduler takes from its inbox and tells
``on_input_taken`` once per loop turn per request: the caller's credit to send more
(``RequestHandle.send`` waits while ``input_window`` chunks are not taken)."""

from __future__ import annotations

import asyncio

from omnictl.messages import INPUT_SOURCE, RequestContext
from omnictl.schedulers.base import IncomingKind
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Stage
from omnictl.topology.model import StageSpec
from tests.stage.test_stage_outputs import Idle, Ports, run
from tests.support.profiler import RecordingProfiler

ENTRY = StageSpec(name="entry", factory="x.y", terminal=True)


def test_chunks_taken_from_the_inbox_are_told_once_a_turn_and_an_abort_s_sorting_takes_none() -> None:
    scheduler = Idle()  # takes nothing by itself: the test takes for it
    stage = Stage(ENTRY, scheduler, FanIn((), None), Router(ENTRY, None, {}), Ports(), RecordingProfiler())  # type: ignore[arg-type]
    told: list[tuple[str, str, int]] = []
    stage.on_input_taken = lambda name, rid, taken: told.append((name, rid, taken))

    async def body() -> None:
        for rid in ("r", "s"):
            for seq in range(3):
                stage.on_stream_chunk(RequestContext(rid, {}, ("entry",)), INPUT_SOURCE, seq, {"i": seq})
        stage.on_stream_chunk(RequestContext("u", {}, ("entry",)), "upstream", 0, {"i": 0})  # a stage's, not a caller's
        await asyncio.sleep(0)
        assert told == []  # queued, not taken
        inbox = scheduler.inbox
        taken = [inbox.get_nowait() for _ in range(2)]  # r's first two
        assert [m.request_id for m in taken] == ["r", "r"] and taken[0].kind is IncomingKind.STREAM_CHUNK
        await asyncio.sleep(0)
        assert told == [("entry", "r", 2)]  # one report for both
        stage.on_abort("s")  # s's chunks leave the inbox; r's last one and u's are put back, not taken
        await asyncio.sleep(0)
        assert told == [("entry", "r", 2)] and inbox.qsize() == 2
        assert [inbox.get_nowait().request_id for _ in range(2)] == ["r", "u"]
        await asyncio.sleep(0)
        assert told == [("entry", "r", 2), ("entry", "r", 3)]  # u's came from a stage: no credit

    run(stage, body)
