"""Bounded stage inboxes: a stage that falls behind holds admission instead of growing its queue."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

import omnictl
from omnictl.admission import Admission
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import eventually

E = "omnictl.models.examples"
INBOX = 4
WORK_S = 0.05


def test_held_admission_refuses_with_a_limit_and_makes_callers_without_one_wait() -> None:
    async def scenario() -> None:
        limited = Admission(max_in_flight=8)
        limited.hold(True)
        with pytest.raises(omnictl.Overloaded, match="backpressure"):
            await limited.admit()
        limited.hold(False)
        (await limited.admit()).release()

        patient = Admission(max_in_flight=None)
        patient.hold(True)
        waiting = asyncio.create_task(patient.admit())
        await asyncio.sleep(0.05)
        assert not waiting.done() and patient.queued == 1 and patient.in_flight == 0
        patient.hold(False)
        ticket = await asyncio.wait_for(waiting, 1)
        assert patient.in_flight == 1 and patient.queued == 0
        ticket.release()
        assert patient.in_flight == 0

    asyncio.run(scenario())


def slow_last_stage(tmp_path: Path, work_s: float = WORK_S) -> Path:
    """A fast producer process feeding a slow terminal whose inbox holds INBOX requests."""
    return topo.write(tmp_path / "slow_last.yaml", [
        {"name": "produce", "factory": f"{E}.identity", "next": ["consume"], "process": "fast"},
        {"name": "consume", "factory": f"{E}.sleep", "factory_args": {"seconds": work_s}, "terminal": True,
         "process": "slow", "relay": {"inbox": INBOX}},
    ])


async def _offer(pipe: Any, seconds: float, handles: list[Any], refused: list[int], peak: dict[str, int]) -> None:
    """Offer requests far faster than the slow stage serves them, sampling its queue."""
    slow = psutil.Process(pipe.process_ids()["slow"])
    blob = np.ones(64 * 1024, dtype=np.float32)  # 256 KB each: a queue of them shows in RSS
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            handles.append(await pipe.submit({"blob": blob}))
        except omnictl.Overloaded:
            refused[0] += 1
        if len(handles) % 5 == 0:
            stats = await pipe.stats()
            peak["queued"] = max(peak["queued"], stats["consume"]["queued"])
            peak["rss"] = max(peak["rss"], slow.memory_info().rss)
        await asyncio.sleep(0.005)  # ~150 offered a second: 7x what the slow stage serves


@pytest.mark.timeout(120)
def test_a_slow_last_stage_keeps_a_bounded_queue_while_load_keeps_coming(loop: LoopThread, tmp_path: Path) -> None:
    # The in-flight limit is off: only the inbox bound stands between the load and the slow stage.
    pipe = launch(loop, slow_last_stage(tmp_path), profile=False, max_in_flight=1000)
    try:
        rss_start = psutil.Process(pipe.process_ids()["slow"]).memory_info().rss
        handles: list[Any] = []
        refused, peak = [0], {"queued": 0, "rss": rss_start}
        loop.run(_offer(pipe, 3.0, handles, refused, peak))
        # ~60 served in 3 s; every one offered would have been admitted without the bound.
        assert refused[0] > len(handles) and len(handles) < 200, (refused, len(handles))
        print(f"admitted {len(handles)}, refused {refused[0]}, peak queued {peak['queued']}, "
              f"RSS +{(peak['rss'] - rss_start) / 2**20:.1f} MB")
        # A few may be admitted in the moment between the stage filling up and the coordinator
        # hearing it (more on a loaded machine); unbounded, hundreds would queue.
        assert peak["queued"] <= INBOX + 12, peak
        assert peak["rss"] - rss_start < 40 * 2**20, (peak["rss"] - rss_start) / 2**20
        for handle in handles:
            loop.run(handle.result())
        assert not pipe.admission.held and pipe.admission.in_flight == 0
    finally:
        loop.run(pipe.close())


@pytest.mark.timeout(120)
def test_a_full_pipeline_aborts_everything_promptly_and_ends_with_zero_state(loop: LoopThread, tmp_path: Path) -> None:
    # 0.3 s a request: the full queue alone is 1.2 s of work; no limit: held callers wait.
    pipe = launch(loop, slow_last_stage(tmp_path, 0.3), profile=False)

    async def fill_then_abort() -> float:
        handles = [await pipe.submit({"i": i}) for i in range(INBOX + 1)]
        await eventually(lambda: pipe.admission.held, timeout=5)
        blocked = asyncio.create_task(pipe.submit({"i": "late"}))  # waits for room: the stage is full
        await asyncio.sleep(0.1)
        assert not blocked.done()
        started = time.monotonic()
        for handle in handles:
            await handle.abort()
        late = await asyncio.wait_for(blocked, 5)  # room again: admitted
        await late.abort()
        while True:
            stats = await pipe.stats()
            if all(s["requests"] == 0 and s["queued"] == 0 and s["running"] == 0 for s in stats.values()) \
                    and pipe.in_flight() == 0 and not pipe.admission.held:
                return time.monotonic() - started
            await asyncio.sleep(0.01)

    try:
        took = loop.run(fill_then_abort(), timeout=30)
        assert took < 1.0, took  # the aborts did not wait behind the queue (1.2 s of work)
        assert pipe.admission.in_flight == 0
        assert loop.run(loop_result(pipe, {"after": 1})) == {"consume": {"after": 1}}
    finally:
        loop.run(pipe.close())


async def loop_result(pipe: omnictl.Pipeline, data: dict[str, int]) -> dict[str, object]:
    return await (await pipe.submit(data)).result()
