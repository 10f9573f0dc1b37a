"""The coordinator's shell over real ZeroMQ, with stand-in stage processes in this process.

A :class:`StubLauncher` (the test double for the launcher, behind the same
``ProcessLauncher`` protocol) starts, instead of OS processes, :class:`StubProcess` peers:
each binds the process's real ipc address, subscribes to the coordinator's broadcasts and
talks to its control socket with the same messages a stage process sends. What the
coordinator does with them — handshakes, submits, results, failures, deaths, restarts,
stats — is then checked in well under a second per test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from omnictl import messages as m
from omnictl.coordinator.autoscale import ScaleDecision
from omnictl.coordinator.coordinator import Coordinator
from omnictl.coordinator.request import RequestEventKind, RequestState
from omnictl.exceptions import (
    InvalidRequest,
    LaunchError,
    PipelineDead,
    RequestAborted,
    RequestFailed,
    UnsupportedPayload,
)
from omnictl.launch_config import LaunchConfig
from omnictl.profiling.events import EventKind
from omnictl.topology import loads
from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import decode
from omnictl.transports.drain import tensor_frames
from omnictl.transports.registry import codec_for
from omnictl.transports.shm import SegmentReader, SlotPool
from tests.support.profiler import RecordingProfiler
from tests.support.wait import eventually, within
from tests.support.wait import run as run_bounded

T = TypeVar("T")

TOPOLOGY = """
stages:
  - {name: prep, factory: m.prep, next: [talk]}
  - {name: talk, factory: m.talk, terminal: true, modality: text, process: voice}
processes:
  voice: {replicas: 2}
"""


class StubHandle:
    def __init__(self, name: str, restarts: int) -> None:
        self.name = name
        self.restarts = restarts
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exited: str | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        return 1000 + self.restarts

    def alive(self) -> bool:
        return self.exited is None

    def describe_exit(self) -> str:
        return self.exited or "still running"

    def kill(self) -> None:
        self.killed = True

    def reported_ready(self, pid: int) -> None:
        if not self.ready.done():
            self.ready.set_result(None)


class StubProcess:
    """One stage process's end of the wire, played by the test."""

    def __init__(self, name: str, coordinator: Coordinator, context: zmq.asyncio.Context) -> None:
        self.name = name
        process = coordinator.topology.processes[name.split("#")[0]]
        self.stages = process.stages
        self.inbound = context.socket(zmq.PULL)
        self.inbound.bind(coordinator.wiring.process_addresses[name])
        self.broadcasts = context.socket(zmq.SUB)
        self.broadcasts.setsockopt(zmq.SUBSCRIBE, b"")
        self.broadcasts.connect(coordinator.wiring.broadcast_address)
        self.control = context.socket(zmq.PUSH)
        self.control.connect(coordinator.wiring.control_address)
        self.heard: list[Any] = []  # broadcasts other than hellos, in order
        self.hellos: list[m.Hello] = []
        self.received: list[tuple[Any, list[bytes]]] = []  # inbound messages with their frames
        self.answer_stats = True
        self.answer_hello = True
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._read())]

    def send(self, message: msgspec.Struct) -> None:
        self.control.send(m.encode(message))

    async def _listen(self) -> None:
        while True:
            message = m.broadcast_decoder.decode(await self.broadcasts.recv())
            if isinstance(message, m.Hello):
                self.hellos.append(message)
                if self.answer_hello:
                    self.send(m.HelloAck(self.name, message.seq))
            elif isinstance(message, m.StatsRequest):
                if self.answer_stats:
                    self.send(m.StatsReply(self.name, message.seq, {s: m.StageStats(running=1) for s in self.stages}))
            else:
                self.heard.append(message)

    async def _read(self) -> None:
        while True:
            parts = await self.inbound.recv_multipart()
            # one multipart carries every message queued in one loop turn: header, its frames, ...
            while parts:
                message = m.inbound_decoder.decode(parts[0])
                count = tensor_frames(message)
                self.received.append((message, parts[1:1 + count]))
                parts = parts[1 + count:]

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for socket in (self.inbound, self.broadcasts, self.control):
            socket.close(linger=0)


class StubLauncher:
    """Starts :class:`StubProcess` peers; ``ready_on_start`` False leaves them silent,
    ``hello_on_start`` False has them report ready but never answer the hello."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        topology = coordinator.topology
        self.process_of = {name: p.name for p in topology.processes.values() for name in p.instances}
        self.node_of: dict[str, str | None] = {name: None for name in self.process_of}
        self.tcp_ports: dict[str, int] = {}
        self.handles: dict[str, StubHandle] = {}
        self.processes: dict[str, StubProcess] = {}
        self.context = zmq.asyncio.Context()
        self.ready_on_start = True
        self.hello_on_start = True
        self.starts: list[str] = []
        self.retired: list[str] = []
        self.stopped = False

    def start(self, name: str) -> StubHandle:
        self.starts.append(name)
        restarts = self.handles[name].restarts + 1 if name in self.handles else 0
        if name in self.processes:
            self.processes.pop(name).close()
        handle = self.handles[name] = StubHandle(name, restarts)
        process = self.processes[name] = StubProcess(name, self.coordinator, self.context)
        process.answer_hello = self.hello_on_start
        if self.ready_on_start:
            process.send(m.Ready(name, handle.pid))
        return handle

    def die(self, name: str, how: str = "killed by SIGKILL") -> None:
        """The process ``name`` exits, as the real launcher reports it."""
        self.handles[name].exited = how
        self.coordinator.on_process_exit(name, how)

    async def retire(self, name: str, timeout: float = 5.0) -> None:
        """Stop a replica on purpose (the autoscaler removes it): forgotten, never reported."""
        self.retired.append(name)
        self.handles.pop(name).exited = "retired"
        self.processes.pop(name).close()

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        for process in self.processes.values():
            process.close()
        self.context.term()


def run(body: Callable[[Coordinator, StubLauncher], Awaitable[T]], config: LaunchConfig | None = None,
        tmp: Path | None = None, start: bool = True, topology: str = TOPOLOGY) -> T:
    async def main() -> T:
        stubs: list[StubLauncher] = []

        def launcher(coordinator: Coordinator) -> StubLauncher:
            stubs.append(StubLauncher(coordinator))
            return stubs[0]

        coordinator = Coordinator(loads(topology), config or LaunchConfig.of(ready_timeout=5.0), launcher=launcher)
        try:
            if start:
                await coordinator.start()
            return await body(coordinator, stubs[0])
        finally:
            await coordinator.close()

    return run_bounded(main, timeout=30)


def inline(data: Any) -> m.EncodedPayload:
    pool = SlotPool("test", "test", 1 << 16, 1)
    try:
        return codec_for(Transport.SHM, pool, RelayKnobs()).encode(data)
    finally:
        pool.close()


def result(request_id: str, data: Any, seq: int = 0, final: bool = True) -> m.TerminalOutput:
    return m.TerminalOutput(request_id, "talk", final, seq, inline(data))


# --- start ---------------------------------------------------------------------------


def test_start_launches_every_replica_and_waits_for_each_hello() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        assert sorted(stub.starts) == ["prep", "voice#0", "voice#1"]
        assert all(h.ready.done() for h in stub.handles.values())
        assert c.healthy and c.health() == ("ok", {})

    run(body)


def test_a_process_that_never_gets_ready_fails_the_start_naming_it() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        with pytest.raises(LaunchError, match=r"stage 'prep' failed to start: process 'prep' was not ready within 0.3s"):
            await c.start()

    run(body, LaunchConfig.of(ready_timeout=0.3), start=False)


def test_a_launch_failure_report_names_the_stage_and_why() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        starting = asyncio.create_task(c.start())
        await eventually(lambda: "voice#1" in stub.processes)
        stub.processes["voice#1"].send(m.LaunchFailed("voice#1", "talk", "no module named m"))
        with pytest.raises(LaunchError, match="stage 'talk' failed to start: no module named m"):
            await starting

    run(body, start=False)


def test_a_process_that_dies_before_its_ready_report_fails_the_start_soon_naming_stage_and_why() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        loop = asyncio.get_running_loop()
        starting = asyncio.create_task(c.start())
        await eventually(lambda: "voice#1" in stub.processes)
        died = loop.time()
        stub.die("voice#1", "exit code 2")  # no LaunchFailed report came: the death is the reason
        with pytest.raises(LaunchError) as error:
            await starting
        assert str(error.value) == "stage 'talk' failed to start: replica 'voice#1' (stages talk) died: exit code 2"
        assert error.value.stage == "talk"
        assert loop.time() - died < 2.0  # the report's grace (0.5 s), not the 5 s ready timeout

    run(body, start=False)


def test_a_launch_report_that_comes_just_after_the_death_still_names_the_cause() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        starting = asyncio.create_task(c.start())
        await eventually(lambda: "voice#1" in stub.processes)
        stub.die("voice#1", "exit code 1")  # its exit seen first ...
        stub.processes["voice#1"].send(m.LaunchFailed("voice#1", "talk", "CUDA out of memory"))  # ... then why
        with pytest.raises(LaunchError, match=r"^stage 'talk' failed to start: CUDA out of memory$"):
            await starting

    run(body, start=False)


def test_a_process_that_exits_before_its_hello_fails_the_start() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        for process in stub.processes.values():
            process.answer_hello = False
        stub.handles["voice#0"].exited = "exit code 2"
        with pytest.raises(LaunchError, match=r"process 'voice#0' exited: exit code 2") as error:
            await c._handshake(["prep", "voice#0"])
        assert error.value.stage == "talk"  # the first stage of the process that exited

    run(body)


# --- requests --------------------------------------------------------------------------


def test_a_submit_reaches_the_entry_process_and_its_result_completes_the_request() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> Any:
        handle = await c.submit({"text": "hi"}, request_id="r1", params={"voice": "joe"})
        prep = stub.processes["prep"]
        await eventually(lambda: prep.received)
        submit, frames = prep.received[0]
        assert isinstance(submit, m.Submit) and (submit.dst, frames) == ("prep", [])
        assert submit.ctx.request_id == "r1" and submit.ctx.params == {"voice": "joe", "modalities": ["text"]}
        assert decode(submit.payload, SegmentReader()) == {"text": "hi"}
        replica = f"voice#{submit.ctx.replicas['voice']}"
        stub.processes[replica].send(result("r1", {"text": "he"}, seq=0, final=False))
        stub.processes[replica].send(result("r1", {"text": "hello"}, seq=1))
        assert await asyncio.wait_for(handle.result(), 3) == {"talk": {"text": "hello"}}
        kinds = [event.kind async for event in handle.events()]
        assert kinds == [RequestEventKind.STREAM, RequestEventKind.RESULT]
        assert c.core.held() == {"requests": 0, "placed": 0, "replica_in_flight": 0, "replays_waiting": 0}

    run(body)


def test_a_large_input_travels_in_a_slot_that_comes_back_when_released() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        await c.submit({"x": np.arange(100_000, dtype=np.float32)}, request_id="r1")
        prep = stub.processes["prep"]
        await eventually(lambda: prep.received)
        submit = prep.received[0][0]
        assert submit.payload.shm is not None and c.endpoint.pools[m.COORDINATOR].in_use == 1
        assert np.array_equal(decode(submit.payload, SegmentReader())["x"], np.arange(100_000, dtype=np.float32))
        prep.send(m.SlotRelease(submit.payload.shm))
        await eventually(lambda: c.endpoint.pools[m.COORDINATOR].in_use == 0)

    run(body)


def test_a_slot_lent_to_a_process_that_dies_before_releasing_it_comes_back() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        await c.submit({"x": np.arange(100_000, dtype=np.float32)}, request_id="r1")
        await eventually(lambda: stub.processes["prep"].received)
        assert c.endpoint.pools[m.COORDINATOR].in_use == 1
        stub.die("prep")  # it never sent the release
        assert c.endpoint.pools[m.COORDINATOR].in_use == 0 and c.held()["slots_in_use"] == 0

    run(body)


def test_a_terminal_output_in_a_slot_is_read_and_the_slot_handed_back_to_its_owner() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({}, request_id="r1")
        replica = c.placement._assigned["r1"]["voice"]
        pool = SlotPool(replica, "talk", 1 << 20, 1)
        try:
            payload = codec_for(Transport.SHM, pool, RelayKnobs()).encode({"audio": np.ones(50_000, np.float32)})
            assert payload.shm is not None and pool.in_use == 1
            stub.processes[replica].send(m.TerminalOutput("r1", "talk", True, 0, payload))
            outcome = await asyncio.wait_for(handle.result(), 3)
            assert np.array_equal(outcome["talk"]["audio"], np.ones(50_000, np.float32))
            released = stub.processes[replica]
            await eventually(lambda: any(isinstance(msg, m.SlotRelease) for msg, _ in released.received))
            release = next(msg for msg, _ in released.received if isinstance(msg, m.SlotRelease))
            assert release.ref == payload.shm  # to the replica that lent it, for that slot
        finally:
            pool.close()

    run(body)


def test_inputs_changed_by_the_caller_after_submit_fail_the_replay_naming_the_stage_and_the_next_replays_go_on() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        spoiled: dict[str, Any] = {"items": []}
        first = await c.submit(spoiled, request_id="r0")
        second = await c.submit({"n": 1}, request_id="r1")
        third = await c.submit({"n": 2}, request_id="r2")
        # equally loaded replicas take turns: r0 and r2 on voice#0
        assert [c.placement._assigned[r]["voice"] for r in ("r0", "r1", "r2")] == ["voice#0", "voice#1", "voice#0"]
        spoiled["items"].append(object())  # the caller changed what it handed over: no longer encodable
        stub.die("voice#0")
        with pytest.raises(RequestFailed, match=r"request r0 could not be replayed: "):
            await asyncio.wait_for(first.result(), 3)
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 4)
        assert prep.received[3][0].ctx.request_id == "r2~1"  # the next replay still went out
        stub.processes["voice#1"].send(result("r1", {"text": "r1"}))
        stub.processes["voice#1"].send(result("r2~1", {"text": "r2"}))
        assert await asyncio.wait_for(asyncio.gather(second.result(), third.result()), 3) == [
            {"talk": {"text": "r1"}}, {"talk": {"text": "r2"}}]
        assert c.core.held()["requests"] == 0

    run(body)


def test_inputs_that_cannot_be_encoded_leave_no_request_behind() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        with pytest.raises(Exception, match="pickle|serial|encode|object"):
            await c.submit({"f": object()}, request_id="r1")
        assert c.core.held() == {"requests": 0, "placed": 0, "replica_in_flight": 0, "replays_waiting": 0}
        await c.submit({"ok": 1}, request_id="r1")  # the id was never used

    run(body)


def test_a_stage_failure_fails_the_request_and_aborts_it_in_every_process() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        stub.processes["prep"].send(m.StageFailed("r1", "prep", "bad input", rejected=True, field="text"))
        with pytest.raises(RequestFailed, match="bad input") as failed:
            await asyncio.wait_for(handle.result(), 3)
        assert (failed.value.stage, failed.value.field) == ("prep", "text")
        for process in stub.processes.values():
            await eventually(lambda p=process: m.Abort(("r1",)) in p.heard)

    run(body)


def test_an_abort_is_broadcast_once_to_every_process() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        await handle.abort()
        await handle.abort()  # already finished: nothing more is sent
        with pytest.raises(RequestAborted):
            await within(handle.result(), "r1's result", 3)
        await eventually(lambda: all(m.Abort(("r1",)) in p.heard for p in stub.processes.values()))
        await asyncio.sleep(0.05)
        assert [p.heard.count(m.Abort(("r1",))) for p in stub.processes.values()] == [1, 1, 1]

    run(body)


def test_a_skipped_terminal_and_a_late_output_are_handled() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        stub.processes["prep"].send(m.TerminalSkipped("r1", "talk"))
        with pytest.raises(RequestFailed, match="every branch was skipped"):
            await asyncio.wait_for(handle.result(), 3)
        stub.processes["voice#0"].send(result("r1", {"text": "late"}))  # dropped: no error, no state
        await asyncio.sleep(0.05)
        assert c.requests == {}

    run(body)


def test_an_output_that_cannot_be_decoded_fails_its_request_naming_the_stage() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        broken = m.EncodedPayload(b"\xc1", (), b"")  # 0xc1 is never valid msgpack
        stub.processes["voice#0"].send(m.TerminalOutput("r1", "talk", True, 0, broken))
        with pytest.raises(RequestFailed, match="the output of stage 'talk' could not be decoded") as failed:
            await asyncio.wait_for(handle.result(), 3)
        assert failed.value.stage == "talk"

    run(body)


def test_a_request_past_its_deadline_fails_naming_what_it_waited_for() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        with pytest.raises(RequestFailed, match=r"missed its deadline of 0.3s; terminals still expected: \['talk'\]"):
            await asyncio.wait_for(handle.result(), 2)

    run(body, LaunchConfig.of(ready_timeout=5.0, request_timeout=0.3))


def test_a_full_inbox_holds_admission_until_it_drains() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        holds: list[bool] = []
        c.on_backpressure = holds.append
        stub.processes["voice#1"].send(m.InboxState("voice#1", "talk", True))
        stub.processes["prep"].send(m.InboxState("prep", "prep", True))
        await eventually(lambda: len(c.full_inboxes) == 2)
        stub.processes["prep"].send(m.InboxState("prep", "prep", False))
        stub.processes["voice#1"].send(m.InboxState("voice#1", "talk", False))
        await eventually(lambda: holds == [True, False])
        stub.processes["voice#0"].send(m.InboxState("voice#0", "talk", True))
        await eventually(lambda: holds == [True, False, True])
        stub.die("voice#0")  # its queue died with it: admission resumes
        assert holds == [True, False, True, False]

    run(body)


# --- deaths and restarts ----------------------------------------------------------------


def test_a_dead_replica_fails_its_requests_and_the_others_keep_serving(caplog: pytest.LogCaptureFixture) -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        first = await c.submit({}, request_id="a")
        second = await c.submit({}, request_id="b")
        placed = {rid: c.placement._assigned[rid]["voice"] for rid in ("a", "b")}
        assert sorted(placed.values()) == ["voice#0", "voice#1"]
        doomed = next(rid for rid, replica in placed.items() if replica == "voice#0")
        survivor = "b" if doomed == "a" else "a"
        stub.die("voice#0")
        with pytest.raises(RequestFailed, match=r"stage 'talk' failed: replica 'voice#0' \(stages talk\) died: "
                                                r"killed by SIGKILL"):
            await within((first if doomed == "a" else second).result(), f"{doomed} to fail", 3)
        assert c.health() == ("degraded", {"voice#0": c.down["voice#0"]})
        await eventually(lambda: m.ProcessLost("voice#0") in stub.processes["prep"].heard)
        heard = stub.processes["prep"].heard
        assert heard.index(m.Abort((doomed,))) < heard.index(m.ProcessLost("voice#0"))
        stub.processes["voice#1"].send(result(survivor, {"text": "ok"}))
        assert await asyncio.wait_for((second if doomed == "a" else first).result(), 3) == {"talk": {"text": "ok"}}
        late = await c.submit({}, request_id="c")
        assert c.placement._assigned[late.id]["voice"] == "voice#1"
        assert c.lost == {"voice#0"}  # no restart allowed (max_restarts 0)
        assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "WARNING")] == [
            "replica 'voice#0' (stages talk) died: killed by SIGKILL; 1 request(s) pinned to it failed, 0 replayed; "
            "no restart left (max_restarts 0)"]

    run(body, LaunchConfig.of(ready_timeout=5.0, replay_limit=0))


def test_a_dead_replica_s_unseen_requests_are_replayed_from_the_entry_on_the_other() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(4)]
        doomed = [rid for rid, chosen in c.placement._assigned.items() if chosen["voice"] == "voice#0"]
        assert len(doomed) == 2
        stub.die("voice#0")
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) >= 6)
        replays = [message for message, _ in prep.received[4:]]
        # arrival order, from the entry, with the inputs the caller gave, on the live replica
        assert [s.ctx.request_id for s in replays] == [f"{rid}~1" for rid in doomed]
        assert all(s.dst == "prep" and s.ctx.replicas == {"voice": 1} for s in replays)
        assert [decode(s.payload, SegmentReader(), False) for s in replays] == [
            {"n": int(rid[1:])} for rid in doomed]
        await eventually(lambda: m.ProcessLost("voice#0") in prep.heard)
        assert prep.heard.index(m.Abort((doomed[0],))) < prep.heard.index(m.ProcessLost("voice#0"))
        for handle in handles:
            wire = f"{handle.id}~1" if handle.id in doomed else handle.id
            stub.processes["voice#1"].send(result(wire, {"text": handle.id}))
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)
        assert outcomes == [{"talk": {"text": f"r{i}"}} for i in range(4)]
        assert c.core.held()["requests"] == 0

    run(body)


def test_a_dead_process_restarts_and_hears_the_aborts_it_missed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        await c.submit({}, request_id="r1")
        stub.die("prep")
        assert c.down and not c.healthy
        await eventually(lambda: stub.starts.count("prep") == 2 and c.healthy)
        assert caplog.records[-1].getMessage() == "stage process 'prep' is back"
        # logged once each: the death with what it cost and what happens next, then each replay
        why = "stage process 'prep' (stages prep) died: killed by SIGKILL"
        assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelname in ("ERROR", "WARNING")] == [
            ("ERROR", f"{why}; 0 request(s) pinned to it failed, 1 replayed; restarting it (restart 1 of 1)"),
            ("WARNING", f"request r1: replayed from the entry (replay 1 of 1): stage 'prep' lost it: {why}")]
        assert stub.handles["prep"].restarts == 1
        await eventually(lambda: m.Abort(("r1",)) in stub.processes["prep"].heard)  # the new one heard it
        assert c.dead_reason is None

    run(body, LaunchConfig.of(ready_timeout=5.0, max_restarts=1))


def test_a_restart_that_never_gets_ready_is_killed_and_the_pipeline_dies_with_no_restart_left(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        stub.die("prep", "exit code 1")
        await eventually(lambda: c.dead_reason is not None, timeout=3)
        assert stub.handles["prep"].killed
        why = "it did not answer within the ready timeout (0.3s)"
        assert f"stage process 'prep' could not be restarted: {why}" in (c.dead_reason or "")
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"][-1] == (
            f"stage process 'prep' could not be restarted: {why}")
        with pytest.raises(PipelineDead, match="could not be restarted"):
            await c.submit({})
        assert c.health()[0] == "down"

    run(body, LaunchConfig.of(ready_timeout=0.3, max_restarts=1))


def test_the_last_replica_lost_makes_the_pipeline_dead_naming_it() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.die("voice#0")
        stub.die("voice#1", "exit code 9")
        assert c.dead_reason is not None and "voice#1" in c.dead_reason and "exit code 9" in c.dead_reason
        with pytest.raises(PipelineDead):
            await c.submit({})

    run(body)


# --- introspection ---------------------------------------------------------------------


def test_stats_gather_every_live_replica_and_show_a_silent_one_as_unknown() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stats = await c.stats(timeout=2.0)
        assert stats["talk"]["status"] == "up" and stats["talk"]["running"] == 2
        stub.processes["voice#1"].answer_stats = False
        started = asyncio.get_running_loop().time()
        stats = await c.stats(timeout=0.3)
        assert asyncio.get_running_loop().time() - started >= 0.3
        assert stats["talk"]["status"] == "unknown" and stats["talk"]["replicas"]["voice#1"] == {"status": "unknown"}
        stub.die("voice#1")
        stats = await c.stats(timeout=2.0)  # a down replica is not waited for
        assert stats["talk"]["status"] == "degraded"
        assert c.nodes() == {"-": {"processes": ["prep", "voice#0", "voice#1"], "status": "degraded"}}

    run(body)


def test_close_aborts_what_runs_stops_the_launcher_and_removes_the_sockets() -> None:
    async def main() -> None:
        stubs: list[StubLauncher] = []
        c = Coordinator(loads(TOPOLOGY), LaunchConfig.of(ready_timeout=5.0),
                        launcher=lambda coordinator: stubs.append(StubLauncher(coordinator)) or stubs[0])
        await c.start()
        handle = await c.submit({}, request_id="r1")
        await c.close()
        with pytest.raises(RequestAborted, match="the pipeline shut down"):
            await within(handle.result(), "r1 to end with the pipeline", 3)
        assert stubs[0].stopped and not c.socket_dir.exists()

    run_bounded(main, timeout=30)


# --- elastic replicas -------------------------------------------------------------------

ELASTIC = """
stages:
  - {name: prep, factory: m.prep, next: [talk]}
  - {name: talk, factory: m.talk, terminal: true, modality: text, process: voice}
processes:
  voice: {replicas: {min: 1, max: 3, queue: 1, window: 0.05, idle: 0.2}}
"""


def scaling_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "omnictl.coordinator.coordinator" and r.getMessage().startswith(("scaling", "replica"))]


def aborted(process: StubProcess) -> set[str]:
    return {rid for message in process.heard if isinstance(message, m.Abort) for rid in message.request_ids}


def test_a_sustained_queue_starts_standby_replicas_which_take_a_share_of_the_backlog(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        assert stub.starts == ["prep", "voice#0"] and c.core.standby == {"voice#1", "voice#2"}
        assert c.scaling() == {"voice": {"replicas": 1, "scaled_up": 0, "scaled_down": 0}}
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(6)]
        assert {c.placement._assigned[h.id]["voice"] for h in handles} == {"voice#0"}
        await eventually(lambda: c.scaling()["voice"]["replicas"] == 3)
        assert stub.starts[2:] == ["voice#1", "voice#2"]  # both at once: 6 in flight, queue 1
        assert c.scaling() == {"voice": {"replicas": 3, "scaled_up": 2, "scaled_down": 0}}
        assert c.core.standby == set() and c._starting == set()
        await eventually(lambda: len(scaling_lines(caplog)) == 4)
        lines = scaling_lines(caplog)
        ups = [line for line in lines if line.startswith("scaling process 'voice' up: 6.0 requests in flight per replica")]
        assert [line.rsplit("; ", 1)[1] for line in ups] == [
            "starting 'voice#1' (1 -> 2 of max 3)", "starting 'voice#2' (2 -> 3 of max 3)"]
        assert sorted(line for line in lines if line.startswith("replica ")) == [
            f"replica 'voice#{i}' is up; 2 queued request(s) moved to it, re-run from the entry" for i in (1, 2)]
        # its even share each (6 over 3 replicas): the newest four, re-sent from the entry once
        # each under a fresh wire id; the oldest two stay where they were pinned
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 10)
        resent = {s.ctx.request_id: s.ctx.replicas["voice"] for s, _ in prep.received[6:]}
        assert sorted(resent) == ["r2~0", "r3~0", "r4~0", "r5~0"]
        assert sorted(resent.values()) == [1, 1, 2, 2]
        assert {rid: c.placement._assigned[rid]["voice"] for rid in ("r0", "r1")} == {"r0": "voice#0", "r1": "voice#0"}
        # the old attempts are aborted everywhere: even if voice#0 had started one, it cannot answer
        await eventually(lambda: {"r2", "r3", "r4", "r5"} <= aborted(stub.processes["voice#0"]))
        assert not {"r0", "r1"} & aborted(stub.processes["voice#0"])

    run(body, topology=ELASTIC)


def test_a_calm_process_drains_its_extra_replica_and_stops_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handles = await scaled_to_two(c, stub)
        answer_both(stub)
        await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)
        # nothing in flight for the idle window: back to `min`, the highest-numbered of equals
        await eventually(lambda: c.scaling()["voice"]["replicas"] == 1 and not c._retiring)
        assert stub.retired == ["voice#1"] and c.core.standby == {"voice#1", "voice#2"} and not c.core.draining
        assert c.scaling() == {"voice": {"replicas": 1, "scaled_up": 1, "scaled_down": 1}}
        await eventually(lambda: m.ProcessLost("voice#1") in stub.processes["prep"].heard)
        lines = scaling_lines(caplog)
        assert lines[-2].startswith("scaling process 'voice' down: 'voice#1' 0.0 requests in flight per replica for ")
        assert lines[-2].endswith("; draining it (2 -> 1)")
        assert lines[-1] == "replica 'voice#1' drained and stopped"
        assert c.core.held()["requests"] == 0

    run(body, topology=ELASTIC)


async def scaled_to_two(c: Coordinator, stub: StubLauncher) -> list[Any]:
    """Two requests queued on voice#0 start voice#1, which takes the newer one."""
    handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(2)]
    await eventually(lambda: c.scaling()["voice"]["replicas"] == 2 and len(stub.processes["prep"].received) == 3)
    assert stub.starts[2:] == ["voice#1"]
    moved = stub.processes["prep"].received[2][0]
    assert (moved.ctx.request_id, moved.ctx.replicas) == ("r1~0", {"voice": 1})  # a move is no replay
    return handles


def answer_both(stub: StubLauncher) -> None:
    """What :func:`scaled_to_two` left: r0 on voice#0, r1's moved attempt on voice#1."""
    stub.processes["voice#0"].send(result("r0", {"text": "r0"}))
    stub.processes["voice#1"].send(result("r1~0", {"text": "r1"}))


def test_a_draining_replica_takes_nothing_new_and_stops_once_its_last_request_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        looked: list[None] = []  # one entry per look of the autoscaler (it removes drained replicas after each)
        decide = c.autoscaler.decide
        c.autoscaler.decide = lambda *a, **k: looked.append(None) or decide(*a, **k)  # type: ignore[method-assign]
        handles = await scaled_to_two(c, stub)
        c._scale(ScaleDecision("voice", "voice#1", False, 1.0, "1.0 requests in flight per replica (the test's)"))
        assert scaling_lines(caplog)[-1] == ("scaling process 'voice' down: 'voice#1' 1.0 requests in flight per "
                                             "replica (the test's); draining it (2 -> 1)")
        late = await c.submit({}, request_id="late")
        assert c.placement._assigned["late"]["voice"] == "voice#0"
        looks = len(looked)
        await eventually(lambda: len(looked) >= looks + 5)  # five looks of the autoscaler: it holds r1, so it stays
        assert stub.retired == [] and c.core.draining == {"voice#1"}
        answer_both(stub)
        stub.processes["voice#0"].send(result("late", {"text": "late"}))
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in [*handles, late])), 3)
        assert [o["talk"]["text"] for o in outcomes] == ["r0", "r1", "late"]
        await eventually(lambda: stub.retired == ["voice#1"] and not c._retiring)
        assert scaling_lines(caplog)[-1] == "replica 'voice#1' drained and stopped"
        assert "voice#1" in c.core.standby and c.scaling()["voice"]["replicas"] == 1

    # max 2: the late request queued on voice#0 cannot start a third replica meanwhile
    run(body, topology=ELASTIC.replace("idle: 0.2", "idle: 30").replace("max: 3", "max: 2"))


def test_a_replica_that_dies_while_draining_is_not_restarted_and_its_unseen_request_is_replayed(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handles = await scaled_to_two(c, stub)
        c.core.drain("voice#1")
        stub.die("voice#1")
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 4)
        replay = prep.received[3][0]
        assert (replay.ctx.request_id, replay.ctx.replicas) == ("r1~1", {"voice": 0})  # replay 1
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == ["replica 'voice#1' (stages talk) died: killed by SIGKILL while draining; 0 request(s) pinned "
                          "to it failed, 1 replayed; it stays removed"]
        assert stub.starts.count("voice#1") == 1  # not restarted
        assert "voice#1" in c.core.standby and not c.core.draining and c.healthy
        stub.processes["voice#0"].send(result("r0", {"text": "r0"}))
        stub.processes["voice#0"].send(result("r1~1", {"text": "r1"}))
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)
        assert [o["talk"]["text"] for o in outcomes] == ["r0", "r1"]

    run(body, LaunchConfig.of(ready_timeout=5.0, max_restarts=3), topology=ELASTIC.replace("idle: 0.2", "idle: 30"))


def test_a_replica_that_never_answers_its_start_is_retired_and_stays_in_standby(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(3)]
        await eventually(lambda: "voice#1" in stub.retired, timeout=3)
        assert "voice#1" not in c._starting and "voice#1" in c.core.standby and "voice#1" not in c.down
        assert c.scaling()["voice"]["replicas"] == 1
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors[0] == ("replica 'voice#1' could not be started (scale up): it did not answer within the ready "
                             "timeout (0.3s); it stays in standby")
        # what it held stays where it was: the requests still complete on voice#0
        for h in handles:
            stub.processes["voice#0"].send(result(h.id, {"text": h.id}))
        assert [o["talk"]["text"] for o in await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)] == [
            "r0", "r1", "r2"]

    run(body, LaunchConfig.of(ready_timeout=0.3), topology=ELASTIC)


def test_a_replica_that_dies_while_starting_fails_its_start_at_once_and_holds_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(2)]
        await eventually(lambda: "voice#1" in stub.handles)
        started = asyncio.get_running_loop().time()
        stub.die("voice#1", "exit code 3")
        await eventually(lambda: "voice#1" in stub.retired)
        assert asyncio.get_running_loop().time() - started < 1.0  # not the 5 s ready timeout
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any("replica 'voice#1' could not be started (scale up): stage 'talk' failed to start: replica 'voice#1' "
                   "(stages talk) died while "
                   "starting: exit code 3; it stays in standby" in e for e in errors)
        assert "voice#1" not in c.down and "voice#1" in c.core.standby
        assert c.health()[0] == "ok"
        for h in handles:
            stub.processes["voice#0"].send(result(h.id, {"text": h.id}))
        await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)

    run(body, topology=ELASTIC)


def test_a_replica_that_reports_ready_but_never_answers_the_hello_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.hello_on_start = False
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(2)]
        await eventually(lambda: "voice#1" in stub.retired, timeout=3)
        assert "voice#1" in c.core.standby and c.scaling()["voice"]["replicas"] == 1
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"][0] == (
            "replica 'voice#1' could not be started (scale up): it did not answer within the ready timeout (0.3s); "
            "it stays in standby")
        assert all(c.placement._assigned[h.id]["voice"] == "voice#0" for h in handles)  # nothing moved to it

    run(body, LaunchConfig.of(ready_timeout=0.3), topology=ELASTIC)


def test_a_new_replica_takes_no_request_whose_caller_has_seen_output(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="omnictl.coordinator.coordinator")

    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(2)]
        for h in handles:  # both streamed a first chunk before the window ended
            stub.processes["voice#0"].send(result(h.id, {"text": "so"}, seq=0, final=False))
        await eventually(lambda: all(c.requests[h.id].output_sent for h in handles))
        await eventually(lambda: c.scaling()["voice"]["replicas"] == 2)
        await eventually(lambda: scaling_lines(caplog)[-1].startswith("replica "))
        assert scaling_lines(caplog)[-1] == "replica 'voice#1' is up"
        assert len(stub.processes["prep"].received) == 2  # nothing re-sent
        assert all(c.placement._assigned[h.id]["voice"] == "voice#0" for h in handles)

    run(body, topology=ELASTIC)


def test_the_autoscaler_looks_every_quarter_of_the_shortest_window() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        looks: list[float] = []
        decide = c.autoscaler.decide

        def timed(*args: Any, **kwargs: Any) -> Any:
            looks.append(asyncio.get_running_loop().time())
            return decide(*args, **kwargs)

        c.autoscaler.decide = timed  # type: ignore[method-assign]
        await eventually(lambda: len(looks) >= 11)
        gaps = sorted(b - a for a, b in zip(looks, looks[1:]))
        # window 0.05 s: a look every 0.02 s (the floor; a quarter would be 0.0125 s), not
        # the 0.25 s ceiling, nor anything near the window itself
        assert 0.015 <= gaps[len(gaps) // 2] < 0.04
        assert c.nodes() == {"-": {"processes": ["prep", "voice#0"], "status": "up"}}  # standby not listed

    run(body, topology=ELASTIC)


def test_a_ready_report_with_a_tcp_address_goes_into_the_next_hello_and_the_relaunch_port() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.processes["voice#1"].send(m.Ready("voice#1", 1000, "tcp://127.0.0.1:6123"))
        await eventually(lambda: "voice#1" in c.launcher.tcp_ports)
        assert c.launcher.tcp_ports == {"voice#1": 6123}  # a relaunch binds the same port
        assert c.endpoint.tcp_addresses == {"voice#1": "tcp://127.0.0.1:6123"}
        await c._handshake(["voice#0"])  # the hello every peer hears carries the address book
        assert stub.processes["voice#0"].hellos[-1].tcp_addresses == {"voice#1": "tcp://127.0.0.1:6123"}

    run(body)


# --- streamed input ----------------------------------------------------------------------


def test_streamed_input_goes_to_the_entry_process_as_stream_chunks_in_order_then_its_end() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        recorder = c.profiler = RecordingProfiler()
        handle = await c.submit({"n": 0}, request_id="r1", params={"voice": "joe"}, input_stream=True)
        for n in range(1, 4):
            await handle.send({"n": n})
        await handle.end_input()
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 5)
        chunks = [message for message, _ in prep.received[:4]]
        assert all(isinstance(chunk, m.StreamChunk) for chunk in chunks)  # no Submit: the input streams
        assert [(ch.src, ch.dst, ch.seq) for ch in chunks] == [(m.INPUT_SOURCE, "prep", seq) for seq in range(4)]
        assert [decode(ch.payload, SegmentReader()) for ch in chunks] == [{"n": n} for n in range(4)]
        assert chunks[0].ctx.request_id == "r1" and chunks[0].ctx.params == {"voice": "joe", "modalities": ["text"]}
        assert all(ch.ctx == chunks[0].ctx for ch in chunks)
        done = prep.received[4][0]
        assert isinstance(done, m.StreamDone) and (done.ctx, done.src, done.dst) == (chunks[0].ctx, m.INPUT_SOURCE, "prep")
        # each chunk's hop, as a stage's stream_to edge records it (the entry records the receipt)
        sent = [(rid, stage, meta) for kind, rid, stage, meta in recorder.events if kind is EventKind.STREAM_SENT]
        assert [(rid, stage, meta["target"], meta["seq"], meta["transport"]) for rid, stage, meta in sent] == [
            ("r1", None, "prep", seq, "shm") for seq in range(4)
        ]
        assert [meta["bytes"] for _, _, meta in sent] == [m.payload_bytes(ch.payload) for ch in chunks]
        assert c.core.requests["r1"].input_stream is not None  # the coordinator holds the count, not the chunks

    run(body)


def test_a_large_chunk_travels_in_a_slot_and_an_abort_mid_input_refuses_the_next() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit(None, request_id="r1", input_stream=True)
        await handle.send({"x": np.arange(100_000, dtype=np.float32)})
        prep = stub.processes["prep"]
        await eventually(lambda: prep.received)
        chunk = prep.received[0][0]
        assert isinstance(chunk, m.StreamChunk) and chunk.seq == 0  # None opens it without a chunk
        assert chunk.payload.shm is not None and c.held()["slots_in_use"] == 1
        await handle.abort()
        await eventually(lambda: any(isinstance(b, m.Abort) for b in prep.heard))
        with pytest.raises(RequestAborted, match="request r1 was aborted"):
            await handle.send({"x": 1})
        with pytest.raises(RequestAborted):
            await handle.end_input()
        prep.send(m.SlotRelease(chunk.payload.shm))  # the stage read it (or dropped it) and let go
        await eventually(lambda: c.held() == {**c.core.held(), "slots_in_use": 0})
        assert c.core.held() == {"requests": 0, "placed": 0, "replica_in_flight": 0, "replays_waiting": 0}
        assert len(prep.received) == 1  # nothing sent after the abort

    run(body)


def test_streamed_input_misuse_is_refused_naming_the_input_and_sends_nothing() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        whole = await c.submit({"text": "hi"}, request_id="whole")
        with pytest.raises(InvalidRequest, match="its input was whole at submit") as error:
            await whole.send({"n": 1})
        assert error.value.field == "input"
        handle = await c.submit(None, request_id="r1", input_stream=True)
        with pytest.raises(UnsupportedPayload):  # nothing sent, no seq taken: the input stays open
            await handle.send({"thing": object()})
        await handle.send({"n": 1})
        await handle.end_input()
        with pytest.raises(InvalidRequest, match=r"^cannot send a chunk to request r1: its input was already ended$"):
            await handle.send({"n": 2})
        with pytest.raises(InvalidRequest, match="cannot end the input of request r1: its input was already ended"):
            await handle.end_input()
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 3)  # the whole submit, one chunk, its end
        assert [type(message) for message, _ in prep.received] == [m.Submit, m.StreamChunk, m.StreamDone]
        assert prep.received[1][0].seq == 0
        stub.processes[f"voice#{prep.received[1][0].ctx.replicas['voice']}"].send(result("r1", {"text": "ok"}))
        await asyncio.wait_for(handle.result(), 3)
        with pytest.raises(InvalidRequest, match="cannot send a chunk to request r1: it has completed"):
            await handle.send({"n": 3})

    run(body)


def test_a_deadline_fails_an_input_never_ended() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        late = await c.submit({"n": 0}, request_id="late", input_stream=True)
        with pytest.raises(RequestFailed, match=r"missed its deadline of 0.3s; its input was never ended \(1 chunk"):
            await asyncio.wait_for(late.result(), 3)
        await eventually(lambda: any(b == m.Abort(("late",)) for b in stub.processes["prep"].heard))
        assert c.held() == {"requests": 0, "placed": 0, "replica_in_flight": 0, "replays_waiting": 0, "slots_in_use": 0}

    run(body, LaunchConfig.of(ready_timeout=5.0, request_timeout=0.3))


def test_a_death_replays_a_streamed_input_to_the_entry_every_chunk_again_then_the_rest() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"n": 0}, request_id="r1", input_stream=True)
        await handle.send({"x": np.arange(100_000, dtype=np.float32)})  # in a slot, both times
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 2)
        replica = f"voice#{prep.received[0][0].ctx.replicas['voice']}"
        stub.die(replica)  # the replica it was pinned to; nothing reached the caller yet
        await eventually(lambda: len(prep.received) == 4)
        await handle.send({"n": 2})
        await handle.end_input()
        await eventually(lambda: len(prep.received) == 6)
        again = [message for message, _ in prep.received[2:]]
        assert [type(message) for message in again] == [m.StreamChunk] * 3 + [m.StreamDone]
        assert {message.ctx.request_id for message in again} == {"r1~1"}  # the replay's wire id
        assert [message.seq for message in again[:3]] == [0, 1, 2]
        data = [decode(message.payload, SegmentReader()) for message in again[:3]]
        assert data[0] == {"n": 0} and data[2] == {"n": 2}
        assert np.array_equal(data[1]["x"], np.arange(100_000, dtype=np.float32))
        assert again[0].ctx.replicas["voice"] != int(replica[-1])  # the other replica now
        for message in (prep.received[1][0], again[1]):
            prep.send(m.SlotRelease(message.payload.shm))
        await eventually(lambda: c.held()["slots_in_use"] == 0)
        assert c.core.replayed == 1 and handle.state is RequestState.RUNNING

    run(body, LaunchConfig.of(ready_timeout=5.0, replay_limit=1))


def test_a_streamed_chunk_changed_after_it_was_sent_fails_the_replay_and_frees_what_it_encoded() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit(None, request_id="r1", input_stream=True)
        changed: dict[str, Any] = {"n": 1}
        await handle.send({"x": np.arange(100_000, dtype=np.float32)})
        await handle.send(changed)
        prep = stub.processes["prep"]
        await eventually(lambda: len(prep.received) == 2)
        changed["n"] = object()  # the caller reused it: the replay cannot send it again
        stub.die(f"voice#{prep.received[0][0].ctx.replicas['voice']}")
        with pytest.raises(RequestFailed, match=r"request r1 could not be replayed: .*UnsupportedPayload"):
            await asyncio.wait_for(handle.result(), 3)
        assert len(prep.received) == 2  # nothing of the replay went out
        prep.send(m.SlotRelease(prep.received[0][0].payload.shm))  # the first attempt's slot
        await eventually(lambda: c.held()["slots_in_use"] == 0)  # the replay's encoded chunk went back at once

    run(body, LaunchConfig.of(ready_timeout=5.0, replay_limit=1))
