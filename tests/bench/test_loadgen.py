"""The load shapes, with a stand-in for one request (this unit only schedules sends)."""

from __future__ import annotations

import asyncio

from omnictl.bench.loadgen import closed_loop, open_loop
from omnictl.bench.stats import RequestRecord


def test_closed_loop_never_exceeds_its_concurrency_and_sends_each_index_once() -> None:
    in_flight, peak, seen = 0, 0, []

    async def send(index: int) -> RequestRecord:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * (index % 3))  # uneven request durations
        in_flight -= 1
        seen.append(index)
        return RequestRecord(index=index, ok=True)

    done: list[RequestRecord] = []
    records = asyncio.run(closed_loop(send, 25, 4, done.append))
    assert peak == 4
    assert sorted(seen) == list(range(25)) and [r.index for r in records] == list(range(25))
    assert len(done) == 25


def test_open_loop_arrivals_do_not_wait_for_earlier_requests() -> None:
    release = asyncio.Event()
    started: list[int] = []

    async def send(index: int) -> RequestRecord:
        started.append(index)
        if len(started) == 10:
            release.set()
        await release.wait()  # nothing finishes until every request has arrived
        return RequestRecord(index=index, ok=True)

    # a loop that waited for earlier requests would never finish: the deadline turns that into a failure
    records = asyncio.run(asyncio.wait_for(open_loop(send, 10, rate=2000.0, on_done=lambda r: None, seed=1), 10))
    assert sorted(r.index for r in records) == list(range(10))
