"""An abort is checked where it lands: each stage that held the request records that it
dropped it, within a fraction of the time the work would have taken. Waiting for the
pipeline to go idle would pass even if no abort were sent (the work ends on its own)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import omnictl
from omnictl.profiling.events import Event, EventKind
from tests.support import topo

E = "omnictl.models.examples"
WORK_S = 5.0  # what the slow stage would take; the abort must land far sooner


@pytest.mark.timeout(120)
def test_an_abort_is_recorded_by_every_stage_holding_the_request_long_before_the_work_would_end(
        tmp_path: Path) -> None:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["slow", "wait"], "process": "one"},
        {"name": "slow", "factory": f"{E}.sleep", "factory_args": {"seconds": WORK_S}, "next": ["join"], "process": "two"},
        {"name": "wait", "factory": f"{E}.identity", "next": ["join"], "process": "one"},
        {"name": "join", "factory": f"{E}.identity", "wait_for": ["slow", "wait"], "merge_fn": f"{E}.merge_dicts",
         "terminal": True, "modality": "merged", "process": "three"},
    ]
    path = topo.write(tmp_path / "abort.yaml", stages)

    async def main() -> tuple[float, float, list[Event]]:
        async with omnictl.Pipeline.launch(path, run_dir=tmp_path / "run") as pipe:
            request = await pipe.submit({"text": "hi"}, request_id="r1")
            deadline = time.monotonic() + 30
            # until `slow` is running it and `join` holds the other branch's half
            while True:
                stats = await pipe.stats()
                if stats["slow"]["running"] and stats["join"]["fanin_buffers"]:
                    break
                assert time.monotonic() < deadline, stats
                await asyncio.sleep(0.02)
            aborted_at = time.time()
            await request.abort()
            with pytest.raises(omnictl.RequestAborted):
                await request.result()
            # the stages' records travel to the collector in batches: wait for them, not for idle
            store = pipe.profile.store
            for _ in range(100):
                events = [e for e in store.iter_events() if e.request_id == "r1"]
                if {e.stage for e in events if e.kind is EventKind.STAGE_ABORTED} >= {"slow", "join"}:
                    break
                await asyncio.sleep(0.05)
            return aborted_at, time.time(), events

    aborted_at, ended_at, events = asyncio.run(main())
    dropped = {e.stage: e.ts / 1e9 for e in events if e.kind is EventKind.STAGE_ABORTED}
    assert set(dropped) == {"slow", "join"}, sorted(e.kind.value for e in events)  # not `a`, `wait`: done with it
    for stage, at in dropped.items():
        assert at - aborted_at < WORK_S / 5, (stage, at - aborted_at)  # the abort, not the work's end
    assert [e.kind for e in events if e.kind is EventKind.STAGE_DONE and e.stage == "slow"] == []
