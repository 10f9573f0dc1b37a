"""The simple scheduler's hand-off to its worker thread, and functions measured quick
enough to run on the event loop itself."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, AsyncIterator, Callable

import pytest

from omnictl.schedulers import simple
from omnictl.schedulers.simple import _PROBE_CALLS, SimpleScheduler
from tests.schedulers.harness import Outcome, new_request, pump


@contextlib.asynccontextmanager
async def started(fn: Callable[[dict[str, Any]], Any]) -> AsyncIterator[SimpleScheduler]:
    scheduler = SimpleScheduler(fn)
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


async def run_requests(scheduler: SimpleScheduler, count: int, start: int = 0) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    ids = [f"r{i}" for i in range(start, start + count)]
    for rid in ids:
        scheduler.inbox.put_nowait(new_request(rid, {"rid": rid}))
    await pump(scheduler, outcomes, lambda: all(rid in outcomes and outcomes[rid].done for rid in ids))
    return outcomes


QUICK = 0.05  # the test's threshold: generous, so a preempted quick call on a loaded machine stays quick


def test_a_quick_function_moves_onto_the_loop_after_its_probe_calls_and_back_once_one_is_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simple, "INLINE_BELOW_S", QUICK)
    threads: list[int] = []
    slow_from = 3 * _PROBE_CALLS

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        if int(data["rid"][1:]) >= slow_from:  # computes for twice the threshold
            end = time.thread_time() + QUICK * 2
            while time.thread_time() < end:
                pass
        return {"echo": data["rid"]}

    async def body() -> None:
        async with started(fn) as scheduler:
            loop_thread = threading.get_ident()
            first = await run_requests(scheduler, _PROBE_CALLS)
            assert all(o.result == {"echo": rid} for rid, o in first.items())
            assert loop_thread not in threads  # probed in the worker thread
            threads.clear()
            await run_requests(scheduler, 2 * _PROBE_CALLS, start=_PROBE_CALLS)
            assert set(threads) == {loop_thread}  # measured quick: on the loop
            threads.clear()
            await run_requests(scheduler, 1, start=slow_from)  # slow, on the loop, once
            await run_requests(scheduler, 4, start=slow_from + 1)
            assert threads[0] == loop_thread and loop_thread not in threads[1:]  # back to the thread for good

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_slow_function_stays_in_the_worker_thread_and_errors_fail_only_their_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simple, "INLINE_BELOW_S", 0.001)
    threads: list[int] = []

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        time.sleep(0.02)  # waits ten times the threshold and more: slow, though it computes nothing
        if data["rid"] == "r3":
            raise ValueError("bad input")
        return {"echo": data["rid"]}

    async def body() -> None:
        async with started(fn) as scheduler:
            outcomes = await run_requests(scheduler, _PROBE_CALLS + 8)
            assert threading.get_ident() not in threads
            assert outcomes["r3"].error is not None and "ValueError: bad input" in outcomes["r3"].error
            assert all(o.result == {"echo": rid} for rid, o in outcomes.items() if rid != "r3")

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_quick_call_the_os_merely_paused_does_not_count_as_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simple, "INLINE_BELOW_S", 0.01)
    threads: list[int] = []

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        time.sleep(0.03)  # three times the threshold in all, but no CPU time: as if preempted
        return {"echo": data["rid"]}

    async def body() -> None:
        async with started(fn) as scheduler:
            await run_requests(scheduler, _PROBE_CALLS)
            await run_requests(scheduler, 2, start=_PROBE_CALLS)
            assert threads[-2:] == [threading.get_ident()] * 2  # on the loop after the probe calls

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_call_that_waited_sends_a_function_back_to_the_thread_until_it_is_quick_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simple, "INLINE_BELOW_S", 0.005)
    threads: list[int] = []

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        if data["rid"] == f"r{_PROBE_CALLS}":
            time.sleep(0.1)  # waits twenty times the threshold, computing nothing
        return {"echo": data["rid"]}

    async def body() -> None:
        async with started(fn) as scheduler:
            loop_thread = threading.get_ident()
            await run_requests(scheduler, _PROBE_CALLS)
            await run_requests(scheduler, 1, start=_PROBE_CALLS)  # on the loop; waits
            assert threads[-1] == loop_thread
            for i in range(_PROBE_CALLS):  # back in the thread, one at a time, quick again
                await run_requests(scheduler, 1, start=_PROBE_CALLS + 1 + i)
                assert threads[-1] != loop_thread
            await run_requests(scheduler, 1, start=2 * _PROBE_CALLS + 1)
            assert threads[-1] == loop_thread  # on the loop again

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_quick_function_takes_an_offered_request_at_once_unless_others_are_queued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simple, "INLINE_BELOW_S", QUICK)
    calls: list[str] = []

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        calls.append(data["rid"])
        return {"echo": data["rid"]}

    async def body() -> None:
        async with started(fn) as scheduler:
            assert not scheduler.offer(new_request("early", {"rid": "early"}))  # not measured yet: queued
            await run_requests(scheduler, _PROBE_CALLS)
            calls.clear()
            assert scheduler.offer(new_request("now", {"rid": "now"}))
            assert calls == ["now"]  # ran inside offer, not on a later wake-up of the scheduler
            result = scheduler.outbox.get_nowait()
            assert (result.request_id, result.data) == ("now", {"echo": "now"})
            scheduler.inbox.put_nowait(new_request("queued", {"rid": "queued"}))
            assert not scheduler.offer(new_request("behind", {"rid": "behind"}))  # keeps its place after "queued"
            assert calls == ["now"] and scheduler.load().running == 0

    asyncio.run(body())
