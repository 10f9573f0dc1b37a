"""Aborts are broadcast; afterwards no stage holds any state for the aborted requests.

The tests share one launch (they kill nothing): a fan-out and fan-in over two processes
whose two sleeping stages hold each request 10 ms, or as long as the request asks."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import numpy as np
import pytest

import omnictl
from tests.support import topo
from tests.support.held import held_by
from tests.support.loop import LoopThread, launch

E = "omnictl.models.examples"
SLEEP = "tests.runtime.runtime_stages.sleep_as_asked"


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    stages = [
        {"name": "a", "factory": SLEEP, "factory_args": {"seconds": 0.01}, "next": ["b", "c"], "process": "one"},
        {"name": "b", "factory": SLEEP, "factory_args": {"seconds": 0.01}, "next": ["d"], "process": "two"},
        {"name": "c", "factory": f"{E}.identity", "next": ["d"], "process": "one"},
        {"name": "d", "factory": f"{E}.identity", "wait_for": ["b", "c"], "merge_fn": f"{E}.merge_dicts",
         "terminal": True, "modality": "merged", "process": "two"},
    ]
    pipeline = launch(loop, topo.write(tmp_path_factory.mktemp("abort") / "abort.yaml", stages), profile=False,
                      launcher="threads")
    yield pipeline
    loop.run(pipeline.close())


def test_hundred_concurrent_requests_aborted_mid_flight_leave_no_state(loop: LoopThread, pipe: Any) -> None:
    async def flood() -> list[Any]:
        blob = np.ones(64 * 1024, dtype=np.float32)  # over the inline threshold: shm slots
        requests = [await pipe.submit({"text": f"r{i}", "blob": blob}) for i in range(100)]
        # Abort once some of them are past the entry stage: state downstream to clear.
        deadline = asyncio.get_running_loop().time() + 10
        while not any(entry["requests"] for name, entry in (await pipe.stats()).items() if name != "a"):
            assert asyncio.get_running_loop().time() < deadline, "no request got past the entry stage"
            await asyncio.sleep(0.01)
        for request in requests:
            await pipe.abort(request.id)
        outcomes = []
        for request in requests:
            try:
                outcomes.append(await request.result())
            except omnictl.RequestAborted as aborted:
                outcomes.append(aborted)
        return outcomes

    outcomes = loop.run(flood())
    aborted = [o for o in outcomes if isinstance(o, omnictl.RequestAborted)]
    assert len(aborted) > 50  # most were still in flight
    assert pipe.in_flight() == 0
    assert loop.run(held_by(pipe, timeout=15), timeout=60) == []
    # and the pipeline still serves
    done = loop.run(_one(pipe, {"text": "after abort"}))
    assert done["d"]["sources"] == ["b", "c"]


async def _one(pipe: Any, data: dict[str, Any]) -> dict[str, Any]:
    return await (await pipe.submit(data)).result()


def test_a_request_id_cannot_be_reused(loop: LoopThread, pipe: Any) -> None:
    async def go() -> None:
        first = await pipe.submit({"x": 1}, request_id="same")
        await first.result()
        try:
            await pipe.submit({"x": 2}, request_id="same")
        except omnictl.InvalidRequest as error:
            assert error.field == "request_id" and "already used" in str(error)
        else:
            raise AssertionError("a reused id was accepted")

    loop.run(go())


def test_abort_event_ends_the_event_stream(loop: LoopThread, pipe: Any) -> None:
    async def go() -> list[Any]:
        request = await pipe.submit({"text": "x", "sleep": 2.0})  # held 2 s at the entry stage
        await pipe.abort(request.id)
        return [event async for event in request.events()]

    events = loop.run(go())
    assert [e.kind for e in events] == ["aborted"]
