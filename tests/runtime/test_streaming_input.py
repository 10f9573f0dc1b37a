"""Streamed input end to end: a request opened with ``input_stream=True`` whose chunks the
test sends over time reach the entry stage, in order, in its own OS process (shared memory
or inline) and from there a stage in the same process (the object itself); an abort, a
deadline, 100 concurrent streams, backpressure at admission and on the caller's sends (a
slow entry), each ending with nothing held anywhere."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

import omnictl
from omnictl import messages as m
from omnictl.profiling.spans import build_trace
from omnictl.topology.model import Transport
from tests.support import topo
from tests.support.held import held_by
from tests.support.input_stages import chunk
from tests.support.loop import LoopThread, launch
from tests.support.wait import eventually

S = "tests.support.input_stages"
SLOT = 5_000  # float32 samples: 20 KB, over the 16 KiB inline limit: the chunk travels in a slot
INLINE = 8
TIMEOUT_S = 4.0  # the slow pipeline's request deadline


def _topology(path: Path, entry_args: dict[str, Any], relay: dict[str, Any] | None = None,
              processes: dict[str, dict[str, Any]] | None = None) -> Path:
    """``entry`` (the caller's chunks cross into its process) streams each chunk on to ``near``
    in the same process; ``near`` ends with ``entry``'s record beside its own."""
    entry: dict[str, Any] = {"name": "entry", "factory": f"{S}.recorder", "factory_args": {"echo": True, **entry_args},
                             "process": "p", "next": ["near"], "stream_to": ["near"]}
    if relay is not None:
        entry["relay"] = relay
    return topo.write(path, [
        entry,
        {"name": "near", "factory": f"{S}.recorder", "factory_args": {"upstream": True}, "process": "p",
         "terminal": True, "modality": "order"},
    ], processes=processes)


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("streaming_input")
    pipeline = launch(loop, _topology(tmp / "t.yaml", {}), run_dir=tmp / "run", profile=True, launcher="threads")
    yield pipeline
    loop.run(pipeline.close())


@pytest.fixture(scope="module")
def slow(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The entry takes 20 ms a chunk and bounds its inbox at 4; requests have TIMEOUT_S."""
    tmp = tmp_path_factory.mktemp("streaming_input_slow")
    path = _topology(tmp / "t.yaml", {"work_s": 0.02}, relay={"inbox": 4})
    pipeline = launch(loop, path, profile=False, request_timeout=TIMEOUT_S, launcher="threads")
    yield pipeline
    loop.run(pipeline.close())


WINDOW = 4  # the bounded pipeline's input_window


@pytest.fixture(scope="module")
def bounded(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The entry takes 20 ms a chunk; a caller may have WINDOW chunks it has not taken."""
    tmp = tmp_path_factory.mktemp("streaming_input_bounded")
    pipeline = launch(loop, _topology(tmp / "t.yaml", {"work_s": 0.02}), profile=False, input_window=WINDOW,
                      launcher="threads")
    yield pipeline
    loop.run(pipeline.close())


@pytest.fixture(scope="module")
def restarting(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A process that dies is started again (and its requests replayed once)."""
    tmp = tmp_path_factory.mktemp("streaming_input_restart")
    pipeline = launch(loop, _topology(tmp / "t.yaml", {}), profile=False, max_restarts=1, replay_limit=1)
    yield pipeline
    loop.run(pipeline.close())


@pytest.fixture(scope="module")
def remote(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The entry's process on another node label: the caller reaches it over CurveZMQ tcp."""
    tmp = tmp_path_factory.mktemp("streaming_input_tcp")
    pipeline = launch(loop, _topology(tmp / "t.yaml", {}, processes={"p": {"node": "box-a"}}), profile=False)
    yield pipeline
    loop.run(pipeline.close())


async def _stream(pipe: Any, count: int, size: Any = lambda i: SLOT if i % 2 else INLINE) -> dict[str, Any]:
    request = await pipe.submit(None, input_stream=True)
    for i in range(count):
        await request.send(chunk(i, size(i)))
    await request.end_input()
    return dict((await asyncio.wait_for(request.result(), 30))["near"])


def _check(result: dict[str, Any], count: int) -> None:
    entry = result["upstream"]
    assert entry["order"] == list(range(count))  # arrived in order at the entry (its process)
    assert entry["sources"] == [m.INPUT_SOURCE] and entry["corrupt"] == 0
    assert result["order"] == list(range(count))  # and on, in order, to a stage in the same process
    assert result["sources"] == ["entry"] and result["corrupt"] == 0


def test_chunks_arrive_in_order_at_the_entry_process_and_on_at_a_stage_in_its_process(loop: LoopThread, pipe: Any) -> None:
    async def scenario() -> list[str]:
        _check(await _stream(pipe, 200), 200)
        return await held_by(pipe)

    assert loop.run(scenario()) == []


def test_an_abort_mid_input_leaves_no_state_and_no_slot(loop: LoopThread, pipe: Any) -> None:
    async def scenario() -> list[str]:
        request = await pipe.submit(None, input_stream=True)
        for i in range(40):
            await request.send(chunk(i, SLOT))
        # the entry holds the request's stream (and maybe slots) when the abort comes
        await eventually(lambda: pipe.in_flight() == 1)
        await request.abort()
        with pytest.raises(omnictl.RequestAborted):
            await request.send(chunk(40, SLOT))
        with pytest.raises(omnictl.RequestAborted):
            await request.result()
        return await held_by(pipe)

    assert loop.run(scenario()) == []


def test_a_hundred_concurrent_input_streams_each_arrive_whole_and_in_order(loop: LoopThread, pipe: Any) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        results = await asyncio.gather(*(_stream(pipe, 20, lambda i, n=n: SLOT if (i + n) % 3 == 0 else INLINE)
                                         for n in range(100)))
        return results, await held_by(pipe)

    results, held = loop.run(scenario(), timeout=120)
    for result in results:
        _check(result, 20)
    assert held == []


def test_the_trace_shows_each_chunk_s_hop_from_the_caller_to_the_entry(loop: LoopThread, pipe: Any) -> None:
    async def scenario() -> tuple[str, list[Any]]:
        request = await pipe.submit(None, input_stream=True)
        for i in range(6):
            await request.send(chunk(i, SLOT if i < 3 else INLINE))
        await request.end_input()
        await request.result()
        store = pipe.profile.store

        def hops() -> list[Any]:
            events = store.events(request.id)
            if not events:  # not written yet: the collector batches them
                return []
            return [s for s in build_trace(request.id, events).of_kind("stream") if s.meta["src"] == m.INPUT_SOURCE]

        await eventually(lambda: len([s for s in hops() if s.meta.get("received", True)]) == 6, timeout=10)
        return request.id, hops()

    _, hops = loop.run(scenario())
    assert [(s.meta["dst"], s.meta["seq"], s.meta["transport"]) for s in hops] == [("entry", i, "shm") for i in range(6)]
    assert all(s.meta["dst_process"] == "p" and s.end_ns >= s.start_ns for s in hops)
    assert [s.meta["bytes"] > SLOT * 4 for s in hops] == [True] * 3 + [False] * 3  # slot, then inline


def test_a_caller_that_never_ends_its_input_fails_at_the_deadline_and_frees_everything(
    loop: LoopThread, slow: Any
) -> None:
    async def scenario() -> tuple[str, list[str]]:
        request = await slow.submit(chunk(0, SLOT), input_stream=True)  # the first chunk with the open
        await request.send(chunk(1, SLOT))
        with pytest.raises(omnictl.RequestFailed) as error:
            await asyncio.wait_for(request.result(), TIMEOUT_S + 5)
        with pytest.raises(omnictl.RequestFailed):
            await request.send(chunk(2, SLOT))
        return str(error.value), await held_by(slow)

    message, held = loop.run(scenario())
    assert f"missed its deadline of {TIMEOUT_S:g}s; its input was never ended (2 chunk(s) received)" in message
    assert held == []


def test_a_full_entry_inbox_holds_admission_while_the_stream_s_own_chunks_flow(loop: LoopThread, slow: Any) -> None:
    async def scenario() -> tuple[dict[str, Any], bool, list[str]]:
        streaming = asyncio.ensure_future(_stream(slow, 40, lambda i: INLINE))
        await eventually(lambda: slow.admission.held, "the entry's full inbox to hold admission")
        result = await streaming  # its chunks kept flowing through the held door
        await eventually(lambda: not slow.admission.held, "admission to resume")
        return result, slow.admission.held, await held_by(slow)

    result, held_after, held = loop.run(scenario())
    _check(result, 40)
    assert not held_after and held == []


def test_chunks_reach_an_entry_on_another_node_over_tcp_in_order(loop: LoopThread, remote: Any) -> None:
    assert remote._coordinator._entry_transport is Transport.TCP  # tensors as frames, CurveZMQ

    async def scenario() -> tuple[dict[str, Any], list[str]]:
        return await _stream(remote, 60), await held_by(remote)

    result, held = loop.run(scenario())
    _check(result, 60)
    assert held == []


def test_a_streamed_input_whose_process_dies_is_replayed_whole_on_the_restarted_one(
    loop: LoopThread, restarting: Any
) -> None:
    async def scenario() -> tuple[dict[str, Any], int, list[str]]:
        request = await restarting.submit(None, input_stream=True)
        for i in range(10):
            await request.send(chunk(i, SLOT if i % 2 else INLINE))
        await eventually(lambda: restarting.in_flight() == 1)
        os.kill(restarting.process_ids()["p"], signal.SIGKILL)  # the caller has seen nothing yet
        for i in range(10, 20):  # kept while the request waits for the restart, then sent after the rest
            await request.send(chunk(i, SLOT if i % 2 else INLINE))
        await request.end_input()
        result = dict((await asyncio.wait_for(request.result(), 60))["near"])
        return result, restarting.replayed, await held_by(restarting)

    result, replayed, held = loop.run(scenario(), timeout=120)
    _check(result, 20)  # every chunk, once, in order, on the new process
    assert replayed == 1 and held == []


def test_a_slow_entry_makes_send_wait_for_credit_never_more_than_the_window_ahead(
    loop: LoopThread, bounded: Any
) -> None:
    """Without credit a caller's chunks piled up in the entry's inbox as fast as it sent them
    (24 chunks in a few ms, 480 ms of work queued behind them)."""

    async def scenario() -> tuple[dict[str, Any], list[int], list[str]]:
        request = await bounded.submit(None, input_stream=True)
        ahead = []
        for i in range(24):
            await request.send(chunk(i, INLINE))
            ahead.append(request.input_in_flight)
        await request.end_input()
        result = dict((await asyncio.wait_for(request.result(), 30))["near"])
        return result, ahead, await held_by(bounded)

    result, ahead, held = loop.run(scenario())
    _check(result, 24)
    assert max(ahead) == WINDOW and all(n <= WINDOW for n in ahead), ahead  # it waited, at the window
    assert held == []


def test_a_send_that_waits_too_long_for_credit_is_refused_naming_the_window_and_the_input_goes_on(
    loop: LoopThread, bounded: Any
) -> None:
    async def scenario() -> tuple[dict[str, Any], str, list[str]]:
        request = await bounded.submit(None, input_stream=True)
        i, stalled = 0, None
        while stalled is None:
            try:
                await request.send(chunk(i, INLINE), timeout=0.001)  # the entry needs 20 ms a chunk
                i += 1
            except omnictl.InputStalled as exc:
                stalled = str(exc)
        assert i >= WINDOW  # the window itself is sent at once
        for j in range(i, i + 3):  # the refused chunk was not sent: send it again, and on
            await request.send(chunk(j, INLINE))
        await request.end_input()
        result = dict((await asyncio.wait_for(request.result(), 30))["near"])
        return result, stalled, await held_by(bounded)

    result, stalled, held = loop.run(scenario())
    assert result["upstream"]["order"] == list(range(len(result["order"])))  # nothing lost, nothing twice
    assert f"input_window {WINDOW}" in stalled and "the entry stage 'entry' has not taken" in stalled
    assert held == []
