"""The tests' one way to wait (tests/support/wait.py): a wait that runs out fails in its own
time, naming what it waited for and, for a coroutine, the line it was stuck at."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.support.wait import eventually, run, until, within


def test_until_returns_true_once_the_condition_holds() -> None:
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    assert until(flag.is_set, timeout=5) is True


def test_until_that_runs_out_names_the_condition_by_its_source_or_by_what() -> None:
    with pytest.raises(AssertionError, match=r"^waited 0.05 s for .*lambda: 1 \+ 1 == 3"):
        until(lambda: 1 + 1 == 3, timeout=0.05)
    with pytest.raises(AssertionError, match=r"^waited 0.05 s for the queue to drain$"):
        until(lambda: False, "the queue to drain", timeout=0.05)


def test_eventually_lets_the_loop_run_while_it_polls() -> None:
    async def scenario() -> None:
        seen: list[int] = []
        asyncio.get_running_loop().call_later(0.02, seen.append, 1)
        await eventually(lambda: seen == [1], timeout=5)
        with pytest.raises(AssertionError, match=r"^waited 0.05 s for two items$"):
            await eventually(lambda: len(seen) == 2, "two items", timeout=0.05)

    run(scenario, timeout=10)


async def _never() -> None:
    await asyncio.Event().wait()  # the line a stuck wait names


async def _calls_never() -> None:
    await _never()


def test_within_names_what_it_awaited_and_the_line_it_was_stuck_at() -> None:
    async def scenario() -> None:
        assert await within(asyncio.sleep(0, "done"), "a sleep", 5) == "done"
        await within(_calls_never(), "the result", 0.05)

    with pytest.raises(AssertionError, match=r"^waited 0.05 s for the result \(stuck at .*test_support_wait.py:39\)$"):
        run(scenario, timeout=10)


def test_run_fails_a_coroutine_that_does_not_finish_in_time_naming_it() -> None:
    with pytest.raises(AssertionError, match=r"^waited 0.05 s for the test's coroutine _calls_never to finish"):
        run(_calls_never, timeout=0.05)
    assert run(asyncio.sleep(0, 7), timeout=5) == 7
