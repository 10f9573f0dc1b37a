"""The streaming scheduler's edges, each in well under a second: its argument checks, the
unit types it joins, what its errors say, the profile events it records, what ``load``
counts, and how ``merge_outputs`` joins each kind of value."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import numpy as np
import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import IncomingKind, IncomingMessage
from omnictl.schedulers.streaming import FinishOn, StreamingScheduler, Window, _concat, merge_outputs
from tests.schedulers.harness import Outcome, RecordingProfiler, pump


def chunk(rid: str, data: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_CHUNK, rid, data, source="up", params={"voice": "v"})


def done(rid: str) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_DONE, rid, None, source="up", params={"voice": "late"})


def request(rid: str, data: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.NEW_REQUEST, rid, data, params={"voice": "v"})


def drive(scheduler: StreamingScheduler, messages: list[IncomingMessage], rids: tuple[str, ...],
          during: Callable[[StreamingScheduler], None] | None = None) -> dict[str, Outcome]:
    """Feed ``messages``, then collect until every one of ``rids`` is done."""
    async def scenario() -> dict[str, Outcome]:
        scheduler.stage_name = "tts"
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            for message in messages:
                scheduler.inbox.put_nowait(message)
            if during is not None:
                await asyncio.sleep(0)
                during(scheduler)
            await pump(scheduler, outcomes, lambda: all(r in outcomes and outcomes[r].done for r in rids), timeout=10)
            return outcomes
        finally:
            await scheduler.stop()

    return asyncio.run(asyncio.wait_for(scenario(), 20))


def echo(window: Window) -> dict[str, Any]:
    return {"units": window.new}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"left_context": -1}, "need left_context >= 0 and chunk_size >= 1, got -1, 1"),
    ({"chunk_size": 0}, "need left_context >= 0 and chunk_size >= 1, got 0, 0"),
    ({"finish_on": "eventually"}, "finish_on must be 'stream_done' or 'request', got 'eventually'"),
])
def test_bad_arguments_are_refused_saying_what_is_allowed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        StreamingScheduler(echo, **kwargs)
    assert str(caught.value) == message


def test_the_smallest_settings_and_the_plain_strings_are_accepted() -> None:
    scheduler = StreamingScheduler(echo, left_context=0, chunk_size=1, finish_on="request")
    assert scheduler.finish_on is FinishOn.REQUEST and (scheduler.left_context, scheduler.chunk_size) == (0, 1)
    assert StreamingScheduler(echo).finish_on is FinishOn.STREAM_DONE


def test_units_of_every_kind_are_joined_in_order() -> None:
    assert _concat(None, (1, 2)) == [1, 2] and _concat(None, [1]) == [1] and _concat(None, "a") == "a"
    assert _concat([1], (2, 3)) == [1, 2, 3] and _concat("ab", "c") == "abc"
    joined = _concat(np.array([1.0]), [2.0, 3.0])
    assert isinstance(joined, np.ndarray) and joined.tolist() == [1.0, 2.0, 3.0]
    tensor = _concat(torch.tensor([1, 2]), [3])
    assert isinstance(tensor, torch.Tensor) and tensor.tolist() == [1, 2, 3]


def test_a_units_function_and_a_split_make_the_windows() -> None:
    seen: list[Window] = []

    def record(window: Window) -> dict[str, Any]:
        seen.append(window)
        return {"text": window.new}

    def sentence(pending: str) -> int:
        return pending.index(".") + 1 if "." in pending else 0

    scheduler = StreamingScheduler(record, units=lambda data: data["t"].lower(), split=sentence, left_context=3)
    outcomes = drive(scheduler, [chunk("r", {"t": "A. B"}), chunk("r", {"t": "C. D"}), done("r")], ("r",))
    assert [w.new for w in seen] == ["a.", " bc.", " d"]
    assert [w.context for w in seen] == ["", "a.", "bc."]  # up to 3 units processed just before each
    assert [(w.index, w.final, w.params) for w in seen] == [(0, False, {"voice": "v"}), (1, False, {"voice": "v"}),
                                                           (2, True, {"voice": "v"})]
    assert outcomes["r"].result == {"text": "a. bc. d"}


def test_a_chunk_without_usable_units_fails_its_request_naming_the_stage_and_the_key() -> None:
    scheduler = StreamingScheduler(echo, units="codes")
    outcomes = drive(scheduler, [chunk("bad", {"other": [1]}), chunk("bad", {"codes": [1]}), done("bad"),
                                 chunk("ok", {"codes": [1, 2]}), done("ok")], ("bad", "ok"))
    assert outcomes["bad"].errors == ["stage tts: stream chunk has no usable units ('codes'): KeyError('codes')"]
    assert outcomes["bad"].chunks == [] and outcomes["ok"].result == {"units": [1, 2]}


def test_callback_failures_say_which_callback_and_keep_a_bad_inputs_field() -> None:
    def bad_input(window: Window) -> dict[str, Any]:
        raise InvalidRequest("voice 'x' is unknown", field="voice")

    def bad_finish(rid: str, params: Any, outputs: list[Any]) -> Any:
        raise RuntimeError("cannot join")

    outcomes = drive(StreamingScheduler(bad_input), [chunk("a", {"token_ids": [1]})], ("a",))
    assert outcomes["a"].errors == ["stage tts: process_chunk failed: InvalidRequest: voice 'x' is unknown"]
    failed: list[Any] = []
    scheduler = StreamingScheduler(echo, finish=bad_finish)
    scheduler.emit = lambda message, emit=scheduler.emit: (failed.append(message), emit(message))  # type: ignore
    outcomes = drive(scheduler, [chunk("b", {"token_ids": [1]}), done("b")], ("b",))
    assert outcomes["b"].errors == ["stage tts: finish failed: RuntimeError: cannot join"]
    assert outcomes["b"].chunks == [{"units": [1]}]
    errors = [m for m in failed if m.error is not None]
    assert [(m.field, type(m.exc).__name__) for m in errors] == [(None, "RuntimeError")]


def test_nothing_is_emitted_for_a_window_whose_callback_returns_none_and_first_emit_is_recorded_once() -> None:
    profiler = RecordingProfiler()

    def odd_only(window: Window) -> dict[str, Any] | None:
        return {"n": window.new} if window.new[0] % 2 else None

    scheduler = StreamingScheduler(odd_only)
    scheduler.profiler = profiler  # type: ignore[assignment]
    outcomes = drive(scheduler, [chunk("r", {"token_ids": [2, 1, 4, 3]}), done("r")], ("r",))
    assert outcomes["r"].chunks == [{"n": [1]}, {"n": [3]}] and outcomes["r"].result == {"n": [1, 3]}
    kinds = [kind for kind, rid, _ in profiler.events]
    assert kinds.count(EventKind.FIRST_EMIT) == 1
    (steps,) = [meta for kind, _, meta in profiler.events if kind is EventKind.DECODE_STEPS]
    assert steps["steps"] == 4 and isinstance(steps["seconds"], float) and steps["seconds"] >= 0


def test_a_stream_done_with_nothing_streamed_ends_the_request_with_its_own_params() -> None:
    seen: list[Any] = []

    def finish(rid: str, params: Any, outputs: list[Any]) -> Any:
        seen.append((rid, dict(params), outputs))
        return {"empty": True}

    outcomes = drive(StreamingScheduler(echo, finish=finish), [done("quiet")], ("quiet",))
    assert outcomes["quiet"].result == {"empty": True} and seen == [("quiet", {"voice": "late"}, [])]


def test_in_request_mode_the_stream_done_does_not_end_the_request() -> None:
    scheduler = StreamingScheduler(echo, chunk_size=10, finish_on="request")
    outcomes = drive(scheduler, [chunk("r", {"token_ids": [1, 2]}), done("r"),
                                 request("r", {"token_ids": [9]})], ("r",))
    assert outcomes["r"].result == {"units": [1, 2]}  # the streamed units; the final result is not added
    assert outcomes["r"].chunks == [{"units": [1, 2]}]


def test_load_counts_buffers_and_queued_jobs_and_abort_forgets_the_request() -> None:
    loads: list[Any] = []

    def check(scheduler: StreamingScheduler) -> None:
        loads.append(scheduler.load())
        scheduler.abort("gone")
        loads.append(scheduler.load())
        scheduler.inbox.put_nowait(chunk("gone", {"token_ids": [3]}))  # late: ignored
        scheduler.inbox.put_nowait(done("kept"))

    scheduler = StreamingScheduler(echo, chunk_size=5)
    outcomes = drive(scheduler, [chunk("gone", {"token_ids": [1]}), chunk("kept", {"token_ids": [1]}),
                                 chunk("gone", {"token_ids": [2]})], ("kept",), during=check)
    assert (loads[0].running, loads[0].stream_buffers) == (2, 2)
    assert (loads[1].running, loads[1].stream_buffers) == (1, 1)
    assert "gone" not in outcomes and outcomes["kept"].result == {"units": [1]}


def test_merge_outputs_keeps_the_last_rate_joins_transcripts_and_keys_by_kind() -> None:
    merged = merge_outputs([AudioChunk(samples=np.ones(1, dtype=np.float32), sample_rate=8000, transcript="a"),
                            AudioChunk(samples=np.ones(2, dtype=np.float32), sample_rate=16000, transcript="b")])
    assert isinstance(merged, AudioResult) and merged.sample_rate == 16000 and merged.transcript == "ab"
    assert merged.samples.shape == (3,)
    assert merge_outputs([]) == {}
    joined = merge_outputs([{"s": "a", "t": torch.ones(1), "n": 1, "first": "x"},
                            {"s": "b", "t": torch.zeros(2), "n": 5}])
    assert joined["s"] == "ab" and joined["t"].tolist() == [1.0, 0.0, 0.0] and joined["n"] == 5
    assert joined["first"] == "x"
    assert merge_outputs([{"n": (1,)}, {"n": (2,)}]) == {"n": (2,)}  # a tuple is a value, not units
    with pytest.raises(TypeError, match=r"^cannot merge a int with the other outputs; pass finish=$"):
        merge_outputs([1])


def test_the_defaults_are_one_unit_windows_of_token_ids_without_context() -> None:
    scheduler = StreamingScheduler(echo)
    assert (scheduler.left_context, scheduler.chunk_size, scheduler.units, scheduler.split) == (0, 1, "token_ids", None)
    scheduler.abort("never-seen")  # nothing of it here: nothing to drop


def test_windows_queued_behind_a_busy_callback_are_counted_and_an_abort_skips_them() -> None:
    import threading

    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def gated(window: Window) -> dict[str, Any]:
        calls.append(window.request_id)
        if window.request_id == "busy":
            entered.set()
            release.wait(5)
        return {"units": window.new}

    async def scenario() -> tuple[list[Any], dict[str, Outcome]]:
        scheduler = StreamingScheduler(gated)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(chunk("busy", {"token_ids": [1]}))
            await asyncio.to_thread(entered.wait, 5)  # the worker is inside the callback
            scheduler.inbox.put_nowait(chunk("gone", {"token_ids": [1, 2, 3]}))  # three windows, queued
            scheduler.inbox.put_nowait(chunk("kept", {"token_ids": [7]}))
            while not scheduler.inbox.empty():
                await asyncio.sleep(0.001)
            loads = [scheduler.load()]
            scheduler.abort("gone")
            release.set()
            scheduler.inbox.put_nowait(done("busy"))
            scheduler.inbox.put_nowait(done("kept"))
            await pump(scheduler, outcomes, lambda: all(r in outcomes and outcomes[r].done for r in ("busy", "kept")))
            return loads, outcomes
        finally:
            await scheduler.stop()

    loads, outcomes = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (loads[0].queued, loads[0].running) == (5, 3)  # busy's running window, 3 of gone's, 1 of kept's
    assert "gone" not in outcomes and "gone" not in calls  # its queued windows were skipped
    assert outcomes["kept"].result == {"units": [7]}


def test_callbacks_run_in_one_named_worker_thread_in_arrival_order() -> None:
    import threading

    threads: list[str] = []

    def record(window: Window) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return {"units": window.new}

    outcomes = drive(StreamingScheduler(record), [chunk("r", {"token_ids": list(range(20))}), done("r")], ("r",))
    assert [c["units"] for c in outcomes["r"].chunks] == [[i] for i in range(20)]
    assert set(threads) == {"tts-worker_0"}  # one thread, named for the stage
    unnamed: list[str] = []

    async def scenario() -> None:
        scheduler = StreamingScheduler(lambda w: unnamed.append(threading.current_thread().name))  # type: ignore
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(chunk("r", {"token_ids": [1]}))
            while not unnamed:
                await asyncio.sleep(0.001)
        finally:
            await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert unnamed == ["stream-worker_0"]


def test_a_message_before_start_is_refused() -> None:
    scheduler = StreamingScheduler(echo)
    with pytest.raises(RuntimeError, match="^StreamingScheduler: submit before start \\(or after stop\\)$"):
        scheduler.accept(chunk("r", {"token_ids": [1]}))


def test_stop_waits_for_the_running_callback_and_cancels_the_queued_ones() -> None:
    import threading

    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    calls: list[Any] = []

    def slow(window: Window) -> dict[str, Any]:
        calls.append(window.new)
        if window.index == 0:
            entered.set()
            release.wait(5)
            finished.set()
        return {"units": window.new}

    async def scenario() -> None:
        scheduler = StreamingScheduler(slow)
        await scheduler.start()
        scheduler.inbox.put_nowait(chunk("r", {"token_ids": [1, 2, 3, 4]}))  # four windows
        await asyncio.to_thread(entered.wait, 5)
        stopping = asyncio.create_task(scheduler.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waits for the callback that is running
        release.set()
        await asyncio.wait_for(stopping, 5)
        assert finished.is_set() and scheduler._executor is None

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert calls == [[1]]  # the three queued windows never ran


def test_a_failed_stream_is_dropped_its_queued_windows_skipped_and_the_error_is_an_error() -> None:
    import threading

    from omnictl.schedulers.base import OutgoingKind, OutgoingMessage

    entered, release = threading.Event(), threading.Event()
    calls: list[Any] = []
    delivered: list[OutgoingMessage] = []

    def gated(window: Window) -> dict[str, Any]:
        calls.append(window.new)
        if window.new == [1]:
            entered.set()
            release.wait(5)
        return {"units": window.new}

    async def scenario() -> list[Any]:
        scheduler = StreamingScheduler(gated, units="codes")
        scheduler.stage_name = "tts"
        scheduler.deliver = delivered.append
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(chunk("r", {"codes": [1, 2]}))  # two windows; the first holds the worker
            await asyncio.to_thread(entered.wait, 5)
            scheduler.inbox.put_nowait(chunk("r", {"nothing": 0}))  # unusable: the request fails
            while not scheduler.inbox.empty():
                await asyncio.sleep(0.001)
            loads = [scheduler.load().stream_buffers]
            release.set()
            while scheduler.load().queued:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
            return loads
        finally:
            await scheduler.stop()

    loads = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert loads == [0] and calls == [[1]]  # dropped at once; its queued window [2] never ran
    assert [(m.kind, m.request_id) for m in delivered] == [(OutgoingKind.ERROR, "r")]


def test_a_whole_input_in_request_mode_keeps_its_params_and_a_bad_one_fails_its_own_request() -> None:
    seen: list[Window] = []

    def record(window: Window) -> dict[str, Any]:
        seen.append(window)
        return {"units": window.new}

    outcomes = drive(StreamingScheduler(record, units="codes", chunk_size=10, finish_on="request"),
                     [request("w", {"codes": [1, 2]}), request("bad", {"other": 1})], ("w", "bad"))
    assert [(w.request_id, w.params, w.final) for w in seen] == [("w", {"voice": "v"}, True)]
    assert outcomes["w"].result == {"units": [1, 2]}
    assert outcomes["bad"].errors == ["stage tts: stream chunk has no usable units ('codes'): KeyError('codes')"]
