"""The Scheduler base class: outputs emitted on the loop and from worker threads reach the
Stage in order, through ``deliver`` or the outbox; the busy clock; compute-phase events;
what ``SchedulerLoad.waiting`` counts."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from tests.schedulers.harness import RecordingProfiler


class Idle(Scheduler):
    """Consumes nothing: a test emits on its behalf."""

    def __init__(self) -> None:
        super().__init__()
        self.ran = asyncio.Event()

    async def run(self) -> None:
        self.ran.set()
        await asyncio.Event().wait()

    def abort(self, request_id: str) -> None:
        pass

    def load(self) -> SchedulerLoad:
        return SchedulerLoad()


def result(rid: str) -> OutgoingMessage:
    return OutgoingMessage(OutgoingKind.RESULT, rid, data=rid)


def test_emitting_before_start_is_refused() -> None:
    with pytest.raises(RuntimeError, match="^scheduler not started$"):
        Idle().emit(result("r"))


def test_outputs_from_threads_and_from_the_loop_reach_deliver_in_order_one_callback_each() -> None:
    delivered: list[tuple[str, bool]] = []

    async def scenario() -> None:
        scheduler = Idle()
        scheduler.deliver = lambda message: delivered.append((message.request_id, in_emit.is_set()))
        in_emit = threading.Event()
        await scheduler.start()
        try:
            await asyncio.wait_for(scheduler.ran.wait(), 5)
            thread = threading.Thread(target=lambda: [scheduler.emit(result(f"t{i}")) for i in range(3)])
            thread.start()
            thread.join()
            in_emit.set()
            scheduler.emit(result("loop"))  # on the loop: after what the thread emitted before it
            in_emit.clear()
            assert delivered == []  # never inside emit itself: each in a loop callback of its own
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert delivered == [("t0", False), ("t1", False), ("t2", False), ("loop", False)]


def test_without_deliver_outputs_go_to_the_outbox() -> None:
    async def scenario() -> list[str]:
        scheduler = Idle()
        await scheduler.start()
        try:
            scheduler.emit(result("a"))
            await asyncio.to_thread(scheduler.emit, result("b"))
            got = [await asyncio.wait_for(scheduler.outbox.get(), 5) for _ in range(2)]
            return [message.request_id for message in got]
        finally:
            await scheduler.stop()
            await scheduler.stop()  # twice: nothing left to stop

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == ["a", "b"]


def test_the_busy_clock_runs_only_inside_a_compute_step() -> None:
    scheduler = Idle()
    assert scheduler.busy_seconds() == 0.0 and scheduler.busy_since is None
    with scheduler.busy():
        time.sleep(0.02)
        assert scheduler.busy_seconds() >= 0.02
    assert scheduler.busy_seconds() == 0.0 and scheduler.busy_since is None
    with pytest.raises(ValueError):
        with scheduler.busy():
            raise ValueError("the step failed")
    assert scheduler.busy_since is None  # a failed step ends too


def test_a_compute_phase_is_recorded_as_start_and_end_with_its_name_even_when_it_fails() -> None:
    scheduler = Idle()
    profiler = RecordingProfiler()
    scheduler.profiler = profiler  # type: ignore[assignment]
    scheduler.stage_name = "talker"
    with scheduler.computing("r1", "synthesis"):
        pass
    with pytest.raises(KeyError):
        with scheduler.computing("r2", "vocode"):
            raise KeyError("x")
    assert profiler.events == [(EventKind.COMPUTE_START, "r1", {"phase": "synthesis"}),
                               (EventKind.COMPUTE_END, "r1", {"phase": "synthesis"}),
                               (EventKind.COMPUTE_START, "r2", {"phase": "vocode"}),
                               (EventKind.COMPUTE_END, "r2", {"phase": "vocode"})]


def test_a_scheduler_takes_nothing_offered_by_default_and_load_counts_waiting_requests() -> None:
    assert Idle().offer(IncomingMessage(IncomingKind.NEW_REQUEST, "r")) is False
    assert SchedulerLoad(queued=7).waiting() == 7
    assert SchedulerLoad(queued=1000, waiting_requests=2).waiting() == 2
    assert SchedulerLoad(queued=5, waiting_requests=0).waiting() == 0


def test_messages_default_to_no_data_no_source_and_no_params() -> None:
    incoming = IncomingMessage(IncomingKind.STREAM_DONE, "r")
    assert (incoming.data, incoming.source, dict(incoming.params)) == (None, None, {})
    assert IncomingMessage(IncomingKind.NEW_REQUEST, "a").params is not IncomingMessage(
        IncomingKind.NEW_REQUEST, "b").params
    outgoing: Any = OutgoingMessage(OutgoingKind.ERROR, "r")
    assert (outgoing.data, outgoing.error, outgoing.field, outgoing.exc) == (None, None, None, None)
