"""A stage process's worker, run in this process against a stand-in coordinator over real
ZeroMQ sockets: it builds its stages and says it is ready (or why it is not), runs what it is
sent, answers hellos and stats, drops aborted requests, fails a message it cannot read (only
its request), and stops cleanly. The launcher's tests run it as an OS process; here its code
is in reach of the tests (and of mutation testing)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from omnictl import messages as m
from omnictl.profiling.events import EventKind
from omnictl.stage.startup import WorkerConfig
from omnictl.stage.worker import Worker
from omnictl.topology import loads
from omnictl.topology.model import EdgeKind, RelayKnobs, Topology
from omnictl.transports import registry
from omnictl.transports.codec import decode
from omnictl.transports.drain import Drain
from omnictl.transports.endpoint import Endpoint
from omnictl.transports.registry import Placement
from omnictl.transports.shm import SegmentReader
from tests.support.input_stages import chunk
from tests.support.profiler import RecordingProfiler
from tests.support.wait import run

F = "tests.stage.build_factories"
TWO = f"""
stages:
  - {{name: a, factory: {F}.double, next: [b], process: one}}
  - {{name: b, factory: {F}.double, terminal: true, process: one}}
"""
SLOW = f"""
stages:
  - {{name: a, factory: {F}.slow, terminal: true, process: one}}
"""


class Coordinator:
    """What a worker talks to: the control socket it reports on, the broadcast it listens
    to, and a codec for entry inputs, as the real coordinator has them."""

    def __init__(self, topology: Topology, directory: Path) -> None:
        self.topology = topology
        self.addresses = {"one": f"ipc://{directory}/p0"}
        self.control_address, self.broadcast_address = f"ipc://{directory}/control", f"ipc://{directory}/broadcast"
        self.endpoint = Endpoint(m.COORDINATOR, topology.wire_layout(), ipc_addresses=self.addresses)
        self.control = self.endpoint.pull(self.control_address)
        self.broadcast = self.endpoint.publisher(self.broadcast_address)
        entry = topology.stages[topology.entry]
        transport = registry.select(Placement(False, None, topology.node_of(entry.name), (), tuple(entry.gpu)))
        self.codec = self.endpoint.codec(m.COORDINATOR, transport, RelayKnobs(slots=4))
        self.reader = SegmentReader()
        self.received: list[Any] = []
        self.drain = Drain(self.control, m.coordinator_decoder.decode, self._receive, "test coordinator")

    def _receive(self, message: Any, frames: list[memoryview]) -> None:
        if isinstance(message, m.TerminalOutput):
            message = (message, decode(message.payload, self.reader, False, frames=frames))
        self.received.append(message)

    def config(self) -> WorkerConfig:
        return WorkerConfig("one", "one", self.topology, None, self.addresses, self.control_address,
                            self.broadcast_address, None, 0, ())

    def submit(self, request_id: str, data: Any, stage: str = "a") -> None:
        payload, frames = self.codec.encode_frames(data)
        ctx = m.RequestContext(request_id, {}, tuple(self.topology.stages))
        self.endpoint.send_to("one", m.Submit(ctx, stage, payload), frames, payload, lender=m.COORDINATOR)

    async def publish(self, message: Any) -> None:
        await self.broadcast.send(m.encode(message))

    async def next(self, kind: type, timeout: float = 10.0) -> Any:
        """The first message of ``kind`` received (taken out of ``received``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for i, message in enumerate(self.received):
                if isinstance(message[0] if isinstance(message, tuple) else message, kind):
                    return self.received.pop(i)
            if loop.time() > deadline:
                raise AssertionError(f"no {kind.__name__} within {timeout}s; got {self.received}")
            await asyncio.sleep(0.01)

    async def hello(self, seq: int) -> m.HelloAck:
        """Broadcasts reach a subscriber only once it has joined: say hello until answered."""
        for _ in range(200):
            await self.publish(m.Hello(seq, {}))
            try:
                ack: m.HelloAck = await self.next(m.HelloAck, timeout=0.05)
                return ack
            except AssertionError:
                continue
        raise AssertionError("the worker never answered a hello")

    def close(self) -> None:
        self.drain.close()
        self.endpoint.close()
        self.reader.close()


@contextlib.asynccontextmanager
async def running(text: str, **config: Any) -> AsyncIterator[tuple[Coordinator, Worker]]:
    """A worker of ``text``'s process `one` (``config``: its configuration's fields that
    differ), started; stopped (it must end within 10 s) after."""
    with tempfile.TemporaryDirectory(prefix="omx-worker-") as directory:
        coordinator = Coordinator(loads(text), Path(directory))
        worker = Worker(dataclasses.replace(coordinator.config(), **config))
        task = asyncio.create_task(worker.run())
        try:
            yield coordinator, worker
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
            coordinator.close()


def test_a_worker_reports_ready_runs_its_stages_in_turn_and_answers_hellos_and_stats() -> None:
    async def scenario() -> None:
        async with running(TWO) as (coordinator, worker):
            ready = await coordinator.next(m.Ready)
            assert (ready.process, ready.pid, ready.tcp_address) == ("one", os.getpid(), "")
            assert set(worker.stages) == {"a", "b"}
            ack = await coordinator.hello(7)
            assert (ack.process, ack.seq) == ("one", 7)
            coordinator.submit("r1", {"n": 3})
            output, data = await coordinator.next(m.TerminalOutput)
            assert (output.request_id, output.stage, output.final, data) == ("r1", "b", True, {"n": 12})  # a, then b
            await coordinator.publish(m.StatsRequest(5))
            reply = await coordinator.next(m.StatsReply)
            assert reply.process == "one" and reply.seq == 5 and set(reply.stages) == {"a", "b"}
            assert all(stats.requests == 0 and stats.running == 0 for stats in reply.stages.values())
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # SIGTERM stops it
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # and is given back when it ends

    run(scenario())


def test_an_abort_broadcast_drops_the_request_at_the_stage_running_it() -> None:
    async def scenario() -> None:
        async with running(SLOW) as (coordinator, worker):
            await coordinator.next(m.Ready)
            await coordinator.hello(1)
            coordinator.submit("long", {"n": 0})
            first, _ = await coordinator.next(m.TerminalOutput)
            assert first.final is False  # streaming: the stage is on it
            await coordinator.publish(m.Abort(("long", "unknown")))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while worker.stages["a"].stats(0).requests:
                assert loop.time() < deadline, worker.stages["a"].stats(0)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # several chunks' time: none comes, no result
            outputs = [x for x in coordinator.received if isinstance(x, tuple)]
            assert all(not output.final for output, _ in outputs) and len(outputs) <= 2, outputs

    run(scenario())


def test_a_message_the_worker_cannot_read_fails_its_request_only(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(TWO) as (coordinator, worker):
            await coordinator.next(m.Ready)
            broken = m.EncodedPayload(skeleton=b"\xc1 not msgpack")
            ctx = m.RequestContext("bad", {}, ("a", "b"))
            coordinator.endpoint.send_to("one", m.Submit(ctx, "a", broken))
            failed = await coordinator.next(m.StageFailed)
            assert (failed.request_id, failed.stage, failed.rejected) == ("bad", "a", True)
            assert failed.error.startswith("stage 'a' could not take its input: ")
            # logged once, where it happened: the request id, the same text, the traceback
            [record] = [r for r in caplog.records if r.name == "omnictl.stage.worker" and r.levelno >= logging.ERROR]
            assert record.getMessage() == failed.error and record.request_id == "bad"  # type: ignore[attr-defined]
            assert record.exc_info is not None
            coordinator.submit("good", {"n": 1})  # the process goes on
            output, data = await coordinator.next(m.TerminalOutput)
            assert output.request_id == "good" and data == {"n": 4}

    run(scenario())


@pytest.mark.parametrize(("factory", "error"), [
    (f"{F}.explode", "its factory raised\nTraceback"),
    (f"{F}.nowhere", "nowhere"),
])
def test_a_stage_that_cannot_be_built_is_reported_and_the_worker_ends(factory: str, error: str) -> None:
    text = f"stages:\n  - {{name: a, factory: {factory}, terminal: true, process: one}}\n"

    async def scenario() -> None:
        with tempfile.TemporaryDirectory(prefix="omx-worker-") as directory:
            coordinator = Coordinator(loads(text), Path(directory))
            try:
                worker = Worker(coordinator.config())
                await asyncio.wait_for(worker.run(), 10)  # returns by itself: nothing to serve
                failed = await coordinator.next(m.LaunchFailed)
                assert (failed.process, failed.stage) == ("one", "a") and error in failed.error, failed.error
                assert worker.stages == {} and not [x for x in coordinator.received if isinstance(x, m.Ready)]
                # given back before the loop closes its wake-up pipe: a SIGTERM from the launcher
                # stopping the rest must not find the loop's handler writing to a closed pipe
                assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            finally:
                coordinator.close()

    run(scenario())



# `b` (this worker) joins `a` and `c`, which run elsewhere: the test sends their hops
JOIN = f"""
stages:
  - {{name: s, factory: {F}.echo, next: [a, c], process: up}}
  - {{name: a, factory: {F}.echo, next: [b], process: up}}
  - {{name: c, factory: {F}.echo, next: [b], process: up}}
  - {{name: b, factory: {F}.echo, wait_for: [a, c], merge_fn: {F}.join, terminal: true, process: one}}
"""


def test_a_hop_and_a_skip_from_another_process_complete_a_fan_in_here() -> None:
    async def scenario() -> None:
        async with running(JOIN) as (coordinator, worker):
            await coordinator.next(m.Ready)
            spy = worker.stages["b"].profiler = RecordingProfiler()
            codec = coordinator.endpoint.codec("a", coordinator.topology.edge("a", "b").transport)
            payload, frames = codec.encode_frames({"n": 5})
            ctx = m.RequestContext("r1", {}, ("s", "a", "c", "b"))
            coordinator.endpoint.send_to("one", m.DataReady(ctx, "a", "b", payload, 0), frames)
            coordinator.endpoint.send_to("one", m.Skip(ctx, "c", "b"))
            output, data = await coordinator.next(m.TerminalOutput)
            # echo returns ("", its input), a list once it crossed: the merge of a's part alone, c skipped
            assert output.request_id == "r1" and data == ["", {"from": ["a"], "a": {"n": 5}}]
            transport = coordinator.topology.edge("a", "b").transport.value
            assert (EventKind.HOP_RECEIVED, "r1", "b", {"source": "a", "transport": transport}) in spy.events

    run(scenario())


BIG = f"""
stages:
  - {{name: a, factory: {F}.big, terminal: true, process: one}}
"""


def test_a_slot_the_coordinator_releases_returns_to_the_stage_s_pool() -> None:
    async def scenario() -> None:
        async with running(BIG) as (coordinator, worker):
            await coordinator.next(m.Ready)
            coordinator.submit("r1", {"n": 0})
            output, data = await coordinator.next(m.TerminalOutput)
            assert output.payload.shm is not None and data["samples"].size == 50_000
            pool = worker.ports.pools["a"]
            assert pool.in_use == 1  # lent until the coordinator is done with it
            await coordinator.publish(m.StatsRequest(3))
            reply = await coordinator.next(m.StatsReply)
            assert reply.stages["a"].slots_in_use == 1
            coordinator.endpoint.send_to("one", m.SlotRelease(output.payload.shm))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while pool.in_use:
                assert loop.time() < deadline, "the released slot never came back"
                await asyncio.sleep(0.01)

    run(scenario())


# `a` elsewhere streams to `b` here (its data goes on to `c`, elsewhere too)
STREAMED = f"""
stages:
  - {{name: a, factory: {F}.echo, next: [c], stream_to: [b], process: up}}
  - {{name: c, factory: {F}.echo, terminal: true, process: up}}
  - {{name: b, factory: {F}.upper, terminal: true, process: one}}
"""


def test_stream_chunks_and_their_end_from_another_process_reach_the_stage_in_order() -> None:
    async def scenario() -> None:
        async with running(STREAMED) as (coordinator, worker):
            await coordinator.next(m.Ready)
            spy = worker.stages["b"].profiler = RecordingProfiler()
            codec = coordinator.endpoint.codec("a", coordinator.topology.edge("a", "b", EdgeKind.STREAM).transport)
            ctx = m.RequestContext("r1", {}, ("a", "b", "c"))
            for seq, text in enumerate(["he", "ll", "o!"]):
                payload, frames = codec.encode_frames({"text": text})
                coordinator.endpoint.send_to("one", m.StreamChunk(ctx, "a", "b", seq, payload, 0), frames)
            coordinator.endpoint.send_to("one", m.StreamDone(ctx, "a", "b"))
            outputs = []
            while not outputs or not outputs[-1][0].final:
                outputs.append(await coordinator.next(m.TerminalOutput))
            assert [data for _, data in outputs[:-1]] == [{"text": "HE"}, {"text": "LL"}, {"text": "O!"}]
            assert outputs[-1][1] == {"text": "HELLO!"} and all(o.request_id == "r1" for o, _ in outputs)
            received = [r for r in spy.events if r[0] is EventKind.STREAM_RECEIVED]
            assert received == [(EventKind.STREAM_RECEIVED, "r1", "b", {"source": "a", "seq": seq}) for seq in range(3)]

    run(scenario())


# `a` takes one request at a time: with `inbox: 2`, a second and a third waiting there fill it
NARROW = f"""
stages:
  - {{name: a, factory: {F}.slow, terminal: true, process: one, relay: {{inbox: 2}}}}
"""


def test_a_full_inbox_and_its_room_again_are_told_to_the_coordinator_once_each() -> None:
    async def scenario() -> None:
        async with running(NARROW) as (coordinator, worker):
            await coordinator.next(m.Ready)
            await coordinator.hello(1)
            coordinator.submit("first", {"n": 0})
            await coordinator.next(m.TerminalOutput)  # running: its inbox is empty again
            assert not [x for x in coordinator.received if isinstance(x, m.InboxState)]
            coordinator.submit("second", {"n": 0})
            seq = 0
            while True:  # until the stage holds it (its check on arrival is told before the stats)
                seq += 1
                await coordinator.publish(m.StatsRequest(seq))
                if (await coordinator.next(m.StatsReply)).stages["a"].queued == 1:
                    break
            assert not [x for x in coordinator.received if isinstance(x, m.InboxState)]  # one, of room for two
            coordinator.submit("third", {"n": 0})
            full = await coordinator.next(m.InboxState, timeout=2)
            assert (full.process, full.stage, full.full) == ("one", "a", True)
            await coordinator.publish(m.Abort(("first", "second", "third")))
            room = await coordinator.next(m.InboxState, timeout=2)
            assert (room.process, room.stage, room.full) == ("one", "a", False)
            await asyncio.sleep(0.1)  # several of the worker's inbox polls: nothing more to tell
            assert not [x for x in coordinator.received if isinstance(x, m.InboxState)]

    run(scenario())


@pytest.mark.parametrize("ours", [True, False])
def test_a_worker_stops_on_its_own_once_its_parent_is_gone(ours: bool) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory(prefix="omx-worker-") as directory:
            coordinator = Coordinator(loads(TWO), Path(directory))
            # a parent pid that is not this process's parent stands for a parent that died
            parent = os.getppid() if ours else os.getppid() + 1_000_000
            worker = Worker(dataclasses.replace(coordinator.config(), parent_pid=parent))
            task = asyncio.create_task(worker.run())
            try:
                if ours:
                    await coordinator.next(m.Ready)  # (without a parent it may stop before this is out)
                # the watch looks once it is up, then every 0.5 s: a live parent keeps it running
                # past one look; a gone one stops it at once (a bound for a loaded machine)
                done, _ = await asyncio.wait({task}, timeout=0.7 if ours else 5.0)
                assert bool(done) is not ours
            finally:
                worker.stop()
                await asyncio.wait_for(task, 10)
                coordinator.close()

    run(scenario())


# --- the process's start, in this process -----------------------------------------------------


def test_die_with_parent_asks_for_sigterm_and_exits_if_the_parent_is_gone_already(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from omnictl.stage import worker

    asked: list[Any] = []
    monkeypatch.setattr(worker.ctypes, "CDLL", lambda name, use_errno: types.SimpleNamespace(
        prctl=lambda option, sig: asked.append((name, use_errno, option, sig))))

    def exit_now(code: int) -> None:
        raise SystemExit(f"exit {code}")

    monkeypatch.setattr(worker.os, "_exit", exit_now)
    worker.die_with_parent(os.getppid())
    assert asked == [("libc.so.6", True, 1, signal.SIGTERM)]  # PR_SET_PDEATHSIG
    with pytest.raises(SystemExit, match="^exit 1$"):
        worker.die_with_parent(os.getppid() + 1_000_000)  # died before prctl took effect

    def no_libc(name: str, use_errno: bool) -> Any:
        raise OSError("not Linux")

    monkeypatch.setattr(worker.ctypes, "CDLL", no_libc)
    worker.die_with_parent(os.getppid())  # the parent-pid watch covers it


@pytest.mark.parametrize("parent", [None, 4242])
def test_serve_sets_up_the_process_from_its_configuration_runs_the_worker_then_exits(
        monkeypatch: pytest.MonkeyPatch, parent: int | None) -> None:
    import sys

    from omnictl import logs
    from omnictl.stage import worker
    from omnictl.stage.startup import encode_config

    config = WorkerConfig("one", "one", loads(TWO), None, {"one": "ipc:///tmp/p0"}, "ipc:///tmp/control",
                          "ipc:///tmp/broadcast", None, 31, ("/user/code", sys.path[0]), log_level="DEBUG",
                          log_format="json", log_file="/run/logs/one.log")
    done: list[Any] = []
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(logs, "configure_stage_process", lambda *args: done.append(("logs", args)))
    monkeypatch.setattr(worker, "die_with_parent", lambda pid: done.append(("parent", pid)))
    handle = signal.signal  # asyncio.run sets (and puts back) its own SIGINT handler too: those pass

    def ignore(sig: int, handler: Any) -> Any:
        if handler is not signal.SIG_IGN:
            return handle(sig, handler)
        done.append(("signal", sig, handler))

    monkeypatch.setattr(worker.signal, "signal", ignore)

    class Ran:
        def __init__(self, config: WorkerConfig) -> None:
            self.config = config

        async def run(self) -> None:
            done.append(("run", self.config))

    monkeypatch.setattr(worker, "Worker", Ran)

    def exit_now(code: int) -> None:
        raise SystemExit(f"exit {code}")

    monkeypatch.setattr(worker.os, "_exit", exit_now)
    with pytest.raises(SystemExit, match="^exit 0$"):
        worker.serve(encode_config(config), parent_pid=parent)
    expected = config if parent is None else dataclasses.replace(config, parent_pid=parent)
    assert done == [
        ("logs", ("DEBUG", "json", "one", Path("/run/logs/one.log"))),
        ("parent", expected.parent_pid),
        ("signal", signal.SIGINT, signal.SIG_IGN),
        ("run", expected),
    ]
    assert sys.path[:2] == ["/user/code", config.sys_path[1]] and sys.path.count(config.sys_path[1]) == 1


LOADING = f"""
stages:
  - {{name: a, factory: {F}.loads_for_a_minute, terminal: true, process: one}}
"""


def test_a_sigterm_while_a_stage_loads_ends_the_worker_at_once_and_is_no_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher stopping a launch whose model is still loading (a ready timeout, Ctrl-C)
    does not wait for the load, nor its 5 s and a SIGKILL: the worker ends now, gives back its
    sockets, reports no failure, and puts this process's SIGTERM handler back."""
    from tests.stage import build_factories

    build_factories.LOADING.clear()

    def terminate_once_loading() -> None:
        assert build_factories.LOADING.wait(30)
        os.kill(os.getpid(), signal.SIGTERM)  # the main thread is inside the factory's load

    from omnictl.stage.ports import WorkerPorts

    reported: list[Any] = []  # every report the worker makes, as it makes it (nothing to wait for)
    send = WorkerPorts.send_control

    def recorded(ports: WorkerPorts, message: Any) -> None:
        reported.append(message)
        send(ports, message)

    monkeypatch.setattr(WorkerPorts, "send_control", recorded)

    async def scenario() -> None:
        with tempfile.TemporaryDirectory(prefix="omx-worker-") as directory:
            coordinator = Coordinator(loads(LOADING), Path(directory))
            worker = Worker(coordinator.config())
            before = signal.getsignal(signal.SIGTERM)
            threading.Thread(target=terminate_once_loading, daemon=True).start()
            started = time.monotonic()
            try:
                with pytest.raises(SystemExit):
                    await worker.run()
                assert time.monotonic() - started < 30  # the load takes 60 s
                assert signal.getsignal(signal.SIGTERM) == before
                assert worker.endpoint.context.closed
                assert not [r for r in reported if isinstance(r, (m.LaunchFailed, m.Ready))], reported
            finally:
                coordinator.close()

    asyncio.run(scenario())


ANYTHING = f"""
stages:
  - {{name: a, factory: {F}.anything, terminal: true, process: one}}
"""


def test_the_worker_builds_its_stages_with_the_launch_s_model_path_and_audio_policy() -> None:
    async def scenario() -> None:
        async with running(ANYTHING, model_path="/weights", audio_policy="deadline") as (coordinator, _):
            await coordinator.next(m.Ready)
            coordinator.submit("r1", {"n": 1})
            _, data = await coordinator.next(m.TerminalOutput)
            assert data == {"model_path": "/weights", "device": "cpu", "audio_policy": "deadline"}

    run(scenario())


# the entry stage takes a streamed input (a request opened with `input_stream=True`)
STREAMED_INPUT = """
stages:
  - {name: a, factory: tests.support.input_stages.recorder, terminal: true, modality: order, process: one}
"""


def test_a_callers_streamed_input_reaches_the_entry_in_order_and_each_slot_goes_back_to_the_caller() -> None:
    async def scenario() -> None:
        async with running(STREAMED_INPUT) as (coordinator, worker):
            await coordinator.next(m.Ready)
            spy = worker.stages["a"].profiler = RecordingProfiler()
            pool = coordinator.endpoint.pools[m.COORDINATOR]
            ctx = m.RequestContext("r1", {}, ("a",))
            for seq in range(6):  # as Coordinator.send_input sends them: from the caller's pool
                payload, frames = coordinator.codec.encode_frames(chunk(seq, 5_000 if seq % 2 else 8))
                message = m.StreamChunk(ctx, m.INPUT_SOURCE, "a", seq, payload, 0)
                coordinator.endpoint.send_to("one", message, frames, payload, lender=m.COORDINATOR)
            assert pool.in_use == 3  # the three 20 KB chunks, in slots
            coordinator.endpoint.send_to("one", m.StreamDone(ctx, m.INPUT_SOURCE, "a"))
            output, data = await coordinator.next(m.TerminalOutput)
            assert output.final and data == {"order": list(range(6)), "sources": [m.INPUT_SOURCE], "corrupt": 0}
            for _ in range(3):  # each slot back to its lender, the caller's process, once read
                pool.release((await coordinator.next(m.SlotRelease)).ref)
            assert pool.in_use == 0
            received = [r for r in spy.events if r[0] is EventKind.STREAM_RECEIVED]
            assert received == [
                (EventKind.STREAM_RECEIVED, "r1", "a", {"source": m.INPUT_SOURCE, "seq": seq}) for seq in range(6)
            ]

    run(scenario())
