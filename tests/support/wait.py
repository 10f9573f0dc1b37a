"""The one way a test waits: every wait is bounded and, when it runs out, fails naming what
it waited for, in seconds, never as the suite's per-test timeout.

- :func:`until` polls a condition from plain (thread) code;
- :func:`eventually` polls a condition inside a running event loop;
- :func:`within` awaits one awaitable with a deadline;
- :func:`run` runs a test's coroutine on a fresh event loop with a deadline.

A condition that is never met is described by ``what`` when given, else by the source line
of the condition itself (a lambda reads well enough: ``lambda: stub.heard == [...]``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def describe(condition: Callable[[], Any], what: str | None = None) -> str:
    """``what``, or the source of ``condition`` (its first line), or its repr."""
    if what:
        return what
    try:
        return inspect.getsource(condition).strip().splitlines()[0]
    except (OSError, TypeError):
        return repr(condition)


def until(condition: Callable[[], Any], what: str | None = None, timeout: float = 10.0,
          interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds: True, or AssertionError naming the condition once
    ``timeout`` has passed. (``assert until(...)`` and a bare ``until(...)`` read the same.)"""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            if condition():  # one last look: it may have held as the deadline passed
                return True
            raise AssertionError(f"waited {timeout:g} s for {describe(condition, what)}")
        time.sleep(interval)
    return True


async def eventually(condition: Callable[[], Any], what: str | None = None, timeout: float = 3.0,
                     interval: float = 0.005) -> None:
    """:func:`until` inside an event loop: the loop runs on while the condition is polled."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {describe(condition, what)}")
        await asyncio.sleep(interval)


async def within(awaitable: Awaitable[T], what: str, timeout: float = 5.0) -> T:
    """``await awaitable``, or AssertionError naming ``what`` and the line it was stuck at
    after ``timeout`` seconds (an awaited result that never comes is a failure of its own,
    not a hang)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    where = _stuck_at(task)
    task.cancel()
    try:
        await task
    except BaseException:  # what the cancelled await raised is not the failure
        pass
    raise AssertionError(f"waited {timeout:g} s for {what}{where}")


def _stuck_at(task: asyncio.Future[Any]) -> str:
    """Where a pending task waits: the innermost frame of its await chain that is a test's
    own code (else the innermost of all), as " (stuck at file:line)"."""
    frames = []
    awaited: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        frames.append(awaited.cr_frame)
        awaited = awaited.cr_await
    if not frames:
        return ""
    ours = [f for f in frames if "/tests/" in f.f_code.co_filename and f.f_code.co_filename != __file__]
    frame = (ours or frames)[-1]
    return f" (stuck at {frame.f_code.co_filename}:{frame.f_lineno})"


def run(scenario: Coroutine[Any, Any, T] | Callable[[], Coroutine[Any, Any, T]], timeout: float = 60.0) -> T:
    """Run one test's coroutine (or coroutine function) on a fresh event loop; one that has
    not finished after ``timeout`` seconds fails naming the coroutine and where it was."""
    coroutine = scenario() if callable(scenario) else scenario
    name = getattr(coroutine, "__qualname__", repr(coroutine))
    return asyncio.run(within(coroutine, f"the test's coroutine {name} to finish", timeout))
