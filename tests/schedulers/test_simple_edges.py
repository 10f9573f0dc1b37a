"""The simple scheduler's other function kinds and its bookkeeping, each in well under a
second: ``async def`` and generator functions, what an error says, aborts of running and
queued work, what ``load`` counts while a batch waits in the worker thread, and the
profile events of each request."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Iterator

from omnictl.exceptions import InvalidRequest
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage
from omnictl.schedulers.simple import SimpleScheduler
from tests.schedulers.harness import Outcome, RecordingProfiler, new_request, pump, wait_for_condition


def drive(fn: Callable[..., Any], body: Callable[[SimpleScheduler, dict[str, Outcome]], Any]) -> Any:
    async def scenario() -> Any:
        scheduler = SimpleScheduler(fn)
        scheduler.stage_name = "s"
        await scheduler.start()
        try:
            return await body(scheduler, {})
        finally:
            await scheduler.stop()

    return asyncio.run(asyncio.wait_for(scenario(), 20))


def all_done(outcomes: dict[str, Outcome], *rids: str) -> Callable[[], bool]:
    return lambda: all(rid in outcomes and outcomes[rid].done for rid in rids)


def test_an_async_function_runs_on_the_loop_and_its_failure_is_its_request_only() -> None:
    async def fn(data: dict[str, Any]) -> Any:
        await asyncio.sleep(0)
        if data["n"] == 2:
            raise InvalidRequest("n must not be 2", field="n")
        return {"n": data["n"] * 10, "thread": threading.current_thread() is threading.main_thread()}

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        for n in (1, 2, 3):
            scheduler.inbox.put_nowait(new_request(f"r{n}", {"n": n}))
        await pump(scheduler, outcomes, all_done(outcomes, "r1", "r2", "r3"))
        assert outcomes["r1"].result == {"n": 10, "thread": True} and outcomes["r3"].result["n"] == 30
        assert outcomes["r2"].errors == ["n must not be 2"]  # bad input: the client's message, no location
        load = scheduler.load()
        assert (load.queued, load.running) == (0, 0)

    drive(fn, body)


def test_an_error_names_its_type_message_and_where_and_an_invalid_request_keeps_its_field() -> None:
    delivered: list[OutgoingMessage] = []

    def fn(data: dict[str, Any]) -> Any:
        if data["kind"] == "bad":
            raise InvalidRequest("voice is unknown", field="voice")
        raise KeyError("missing")

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.deliver = delivered.append
        scheduler.inbox.put_nowait(new_request("bad", {"kind": "bad"}))
        scheduler.inbox.put_nowait(new_request("bug", {"kind": "bug"}))
        await wait_for_condition(lambda: len(delivered) == 2)

    drive(fn, body)
    by_id = {message.request_id: message for message in delivered}
    assert (by_id["bad"].kind, by_id["bad"].error, by_id["bad"].field) == (OutgoingKind.ERROR, "voice is unknown",
                                                                          "voice")
    assert isinstance(by_id["bad"].exc, InvalidRequest)
    assert by_id["bug"].field is None and isinstance(by_id["bug"].exc, KeyError)
    assert by_id["bug"].error is not None and by_id["bug"].error.startswith("KeyError: 'missing' (at test_simple_edges.py:")


def test_a_generator_function_streams_its_yields_and_returns_its_result() -> None:
    def fn(data: dict[str, Any]) -> Iterator[Any]:
        for i in range(data["n"]):
            yield {"part": i}
        return {"parts": data["n"]}

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.inbox.put_nowait(new_request("g", {"n": 3}))
        await pump(scheduler, outcomes, all_done(outcomes, "g"))
        assert outcomes["g"].chunks == [{"part": 0}, {"part": 1}, {"part": 2}]
        assert outcomes["g"].result == {"parts": 3}

    drive(fn, body)


def test_an_aborted_generator_stops_at_its_next_yield_and_sends_nothing_more() -> None:
    yielded = threading.Event()
    resume = threading.Event()
    closed = threading.Event()

    def fn(data: dict[str, Any]) -> Iterator[Any]:
        if data.get("quick"):
            return "quick"
        try:
            yield "first"
            yielded.set()
            resume.wait(5)
            yield "second"
            yield "third"
        finally:
            closed.set()
        return "the end"

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.inbox.put_nowait(new_request("g", {}))
        await asyncio.to_thread(yielded.wait, 5)
        scheduler.abort("g")
        resume.set()
        await asyncio.to_thread(closed.wait, 5)
        scheduler.inbox.put_nowait(new_request("next", {"quick": True}))
        await pump(scheduler, outcomes, all_done(outcomes, "next"))
        assert outcomes["g"].chunks == ["first", "second"] and not outcomes["g"].done  # no third, no result

    drive(fn, body)


def test_while_a_batch_waits_in_the_thread_load_counts_it_as_queued_and_abort_skips_a_queued_one() -> None:
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def fn(data: dict[str, Any]) -> Any:
        ran.append(data["rid"])
        if data["rid"] == "first":
            started.set()
            release.wait(5)
        return data["rid"]

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        for rid in ("first", "second", "third"):
            scheduler.inbox.put_nowait(new_request(rid, {"rid": rid}))
        scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "first", {"x": 1}))  # not consumed
        await asyncio.to_thread(started.wait, 5)
        load = scheduler.load()
        assert (load.queued, load.running) == (2, 1)  # one running, two handed over and not started
        assert scheduler.busy_seconds() > 0
        scheduler.abort("second")
        scheduler.abort("never-seen")  # nothing of it here: nothing to do
        release.set()
        await pump(scheduler, outcomes, all_done(outcomes, "first", "third"))
        assert ran == ["first", "third"] and "second" not in outcomes
        await wait_for_condition(lambda: scheduler.load().running == 0)
        assert scheduler.busy_seconds() == 0.0 and scheduler._aborted == set()

    drive(fn, body)


def test_each_request_records_its_build_start_and_end_and_a_failed_one_no_end() -> None:
    profiler = RecordingProfiler()

    def fn(data: dict[str, Any]) -> Any:
        if data["fail"]:
            raise RuntimeError("no")
        return 1

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.profiler = profiler  # type: ignore[assignment]
        scheduler.inbox.put_nowait(new_request("ok", {"fail": False}))
        scheduler.inbox.put_nowait(new_request("no", {"fail": True}))
        await pump(scheduler, outcomes, all_done(outcomes, "ok", "no"))

    drive(fn, body)
    events = [(kind, rid) for kind, rid, _ in profiler.events]
    assert events == [(EventKind.BUILD_START, "ok"), (EventKind.BUILD_END, "ok"), (EventKind.BUILD_START, "no")]


def test_stop_ends_the_worker_thread() -> None:
    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> threading.Thread:
        scheduler.inbox.put_nowait(new_request("r", {}))
        await pump(scheduler, outcomes, all_done(outcomes, "r"))
        thread = scheduler._thread
        assert thread is not None and thread.name == "stage-s" and thread.daemon
        return thread

    thread = drive(lambda data: 1, body)
    thread.join(5)
    assert not thread.is_alive()


def test_an_async_functions_request_records_its_build_start_and_end() -> None:
    profiler = RecordingProfiler()

    async def fn(data: dict[str, Any]) -> Any:
        return 1

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.profiler = profiler  # type: ignore[assignment]
        scheduler.inbox.put_nowait(new_request("a", {}))
        await pump(scheduler, outcomes, all_done(outcomes, "a"))

    drive(fn, body)
    assert [(kind, rid) for kind, rid, _ in profiler.events] == [(EventKind.BUILD_START, "a"),
                                                                (EventKind.BUILD_END, "a")]


def test_an_async_request_aborted_while_it_runs_sends_nothing_and_leaves_nothing_behind() -> None:
    gate = asyncio.Event()

    async def fn(data: dict[str, Any]) -> Any:
        if data.get("wait"):
            await gate.wait()
        return data

    async def body(scheduler: SimpleScheduler, outcomes: dict[str, Outcome]) -> None:
        scheduler.inbox.put_nowait(new_request("slow", {"wait": True}))
        await wait_for_condition(lambda: "slow" in scheduler._running)
        scheduler.abort("slow")
        gate.set()
        scheduler.inbox.put_nowait(new_request("next", {}))
        await pump(scheduler, outcomes, all_done(outcomes, "next"))
        assert "slow" not in outcomes and scheduler._aborted == set() and scheduler._running == set()

    drive(fn, body)
