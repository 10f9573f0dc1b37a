"""A request's record and handle alone: how each way of finishing reaches the caller."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from omnictl.coordinator.launcher import describe_exit
from omnictl.coordinator.request import (
    RequestEvent,
    RequestEventKind,
    RequestHandle,
    RequestRecord,
    RequestState,
)
from omnictl.exceptions import RequestAborted, RequestError, RequestFailed


def record() -> RequestRecord:
    return RequestRecord("r1", expected={"text"}, active=("a", "text"), deadline=0.0)


async def events_of(handle: RequestHandle) -> list[RequestEvent]:
    return [event async for event in handle.events()]


def test_a_completed_request_hands_out_a_copy_of_its_results_and_ends_its_events() -> None:
    async def go() -> tuple[Any, ...]:
        rec = record()
        handle = RequestHandle(rec, abort=lambda rid: asyncio.sleep(0))
        assert (handle.id, handle.state, rec.finished) == ("r1", RequestState.PENDING, False)
        rec.events.put_nowait(RequestEvent(RequestEventKind.RESULT, "text", data="hi"))
        rec.results["text"] = "hi"
        rec.finish(RequestState.COMPLETED)
        rec.results["late"] = "changed"  # after the fact: not in what the caller got
        return handle.state, rec.finished, await handle.result(), await events_of(handle)

    state, finished, result, events = asyncio.run(go())
    assert (state, finished, result) == (RequestState.COMPLETED, True, {"text": "hi"})
    assert events == [RequestEvent(RequestEventKind.RESULT, "text", data="hi")]


@pytest.mark.parametrize(("error", "state", "kind"), [
    (RequestFailed("r1", "stage 'a' failed: boom", stage="a"), RequestState.FAILED, RequestEventKind.ERROR),
    (RequestAborted("r1", "aborted by the caller"), RequestState.ABORTED, RequestEventKind.ABORTED),
])
def test_a_failed_or_aborted_request_ends_its_events_with_why_and_raises_from_result(
        error: RequestError, state: RequestState, kind: RequestEventKind) -> None:
    async def go() -> tuple[Any, ...]:
        rec = record()
        handle = RequestHandle(rec, abort=lambda rid: asyncio.sleep(0))
        rec.finish(state, error)
        with pytest.raises(type(error)) as raised:
            await handle.result()
        return rec.finished, raised.value, await events_of(handle)

    finished, raised, events = asyncio.run(go())
    assert finished and raised is error
    assert events == [RequestEvent(kind, error.stage, error=str(error))]


def test_abort_through_the_handle_names_its_request() -> None:
    asked: list[str] = []

    async def abort(request_id: str) -> None:
        asked.append(request_id)

    async def go() -> None:
        await RequestHandle(record(), abort).abort()

    asyncio.run(go())
    assert asked == ["r1"]


@pytest.mark.parametrize(("code", "said"), [
    (None, "still running"), (0, "exit code 0"), (3, "exit code 3"),
    (-signal.SIGKILL, "killed by SIGKILL"), (-signal.SIGSEGV, "killed by SIGSEGV"), (-200, "killed by signal 200"),
])
def test_describe_exit(code: int | None, said: str) -> None:
    assert describe_exit(code) == said
