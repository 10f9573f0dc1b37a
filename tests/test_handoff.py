"""Handoff: items from any thread reach the consumer in order, one wake-up per burst."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

import pytest

from omnictl.handoff import Handoff


def test_a_burst_costs_one_wake_up_and_keeps_its_order() -> None:
    consumed: list[int] = []
    wakes: list[Callable[[], None]] = []
    handoff: Handoff[int] = Handoff(consumed.append, wakes.append)
    for i in range(5):
        handoff.put(i)
    assert len(wakes) == 1 and consumed == []
    wakes[0]()
    assert consumed == [0, 1, 2, 3, 4]
    handoff.put(5)  # the next burst wakes again
    assert len(wakes) == 2
    wakes[1]()
    assert consumed == [0, 1, 2, 3, 4, 5]


def test_an_item_put_while_a_drain_runs_is_not_left_behind() -> None:
    wakes: list[Callable[[], None]] = []
    consumed: list[int] = []

    def consume(item: int) -> None:
        consumed.append(item)
        if item == 0:
            handoff.put(1)  # arrives mid-drain: taken by this drain, or it schedules another

    handoff: Handoff[int] = Handoff(consume, wakes.append)
    handoff.put(0)
    while wakes:
        wakes.pop(0)()
    assert consumed == [0, 1]


def test_a_wake_up_that_fails_reaches_the_caller_and_is_not_retried() -> None:
    calls = 0

    def closed_loop(fn: Callable[[], None]) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("Event loop is closed")

    handoff: Handoff[int] = Handoff(lambda item: None, closed_loop)
    with pytest.raises(RuntimeError):
        handoff.put(1)
    handoff.put(2)
    assert calls == 1


def test_threads_hand_everything_to_the_loop_in_each_threads_order() -> None:
    async def run() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        consumed: list[tuple[int, int]] = []
        handoff: Handoff[tuple[int, int]] = Handoff(consumed.append, loop.call_soon_threadsafe)

        def produce(thread: int) -> None:
            for i in range(2000):
                handoff.put((thread, i))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(3)]
        for thread in threads:
            thread.start()
        # the drain a last put scheduled was queued on the loop before this wait's own wake-up
        await asyncio.to_thread(lambda: [thread.join() for thread in threads])
        return consumed

    consumed = asyncio.run(run())
    assert len(consumed) == 6000
    for t in range(3):
        assert [i for thread, i in consumed if thread == t] == list(range(2000))
