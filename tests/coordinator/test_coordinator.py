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
from omnictl.coordinator.coordinator import Coordinator
from omnictl.coordinator.request import RequestEventKind
from omnictl.exceptions import LaunchError, PipelineDead, RequestAborted, RequestFailed
from omnictl.launch_config import LaunchConfig
from omnictl.topology import loads
from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import decode
from omnictl.transports.drain import tensor_frames
from omnictl.transports.registry import codec_for
from omnictl.transports.shm import SegmentReader, SlotPool

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
        self.inbound.bind(coordinator.process_addresses[name])
        self.broadcasts = context.socket(zmq.SUB)
        self.broadcasts.setsockopt(zmq.SUBSCRIBE, b"")
        self.broadcasts.connect(coordinator.broadcast_address)
        self.control = context.socket(zmq.PUSH)
        self.control.connect(coordinator.control_address)
        self.heard: list[Any] = []  # broadcasts other than hellos, in order
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
    """Starts :class:`StubProcess` peers; ``ready_on_start`` False leaves them silent."""

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
        self.starts: list[str] = []
        self.stopped = False

    def start(self, name: str) -> StubHandle:
        self.starts.append(name)
        restarts = self.handles[name].restarts + 1 if name in self.handles else 0
        if name in self.processes:
            self.processes.pop(name).close()
        handle = self.handles[name] = StubHandle(name, restarts)
        process = self.processes[name] = StubProcess(name, self.coordinator, self.context)
        if self.ready_on_start:
            process.send(m.Ready(name, handle.pid))
        return handle

    def die(self, name: str, how: str = "killed by SIGKILL") -> None:
        """The process ``name`` exits, as the real launcher reports it."""
        self.handles[name].exited = how
        self.coordinator.on_process_exit(name, how)

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        for process in self.processes.values():
            process.close()
        self.context.term()


def run(body: Callable[[Coordinator, StubLauncher], Awaitable[T]], config: LaunchConfig | None = None,
        tmp: Path | None = None, start: bool = True) -> T:
    async def main() -> T:
        stubs: list[StubLauncher] = []

        def launcher(coordinator: Coordinator) -> StubLauncher:
            stubs.append(StubLauncher(coordinator))
            return stubs[0]

        coordinator = Coordinator(loads(TOPOLOGY), config or LaunchConfig(ready_timeout=5.0), launcher=launcher)
        try:
            if start:
                await coordinator.start()
            return await body(coordinator, stubs[0])
        finally:
            await coordinator.close()

    return asyncio.run(main())


async def until(check: Callable[[], Any], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


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
        with pytest.raises(LaunchError, match=r"stage 'prep' failed to start: process 'prep' was not ready within 0s"):
            await c.start()

    run(body, LaunchConfig(ready_timeout=0.3), start=False)


def test_a_launch_failure_report_names_the_stage_and_why() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        starting = asyncio.create_task(c.start())
        await until(lambda: "voice#1" in stub.processes)
        stub.processes["voice#1"].send(m.LaunchFailed("voice#1", "talk", "no module named m"))
        with pytest.raises(LaunchError, match="stage 'talk' failed to start: no module named m"):
            await starting

    run(body, start=False)


def test_a_process_that_exits_before_its_hello_fails_the_start() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        for process in stub.processes.values():
            process.answer_hello = False
        stub.handles["voice#0"].exited = "exit code 2"
        with pytest.raises(LaunchError, match=r"process 'voice#0' exited: exit code 2"):
            await c._handshake(["prep", "voice#0"])

    run(body)


# --- requests --------------------------------------------------------------------------


def test_a_submit_reaches_the_entry_process_and_its_result_completes_the_request() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> Any:
        handle = await c.submit({"text": "hi"}, request_id="r1", params={"voice": "joe"})
        prep = stub.processes["prep"]
        await until(lambda: prep.received)
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
        await until(lambda: prep.received)
        submit = prep.received[0][0]
        assert submit.payload.shm is not None and c.endpoint.pools[m.COORDINATOR].in_use == 1
        assert np.array_equal(decode(submit.payload, SegmentReader())["x"], np.arange(100_000, dtype=np.float32))
        prep.send(m.SlotRelease(submit.payload.shm))
        await until(lambda: c.endpoint.pools[m.COORDINATOR].in_use == 0)

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
            await until(lambda p=process: m.Abort(("r1",)) in p.heard)

    run(body)


def test_an_abort_is_broadcast_once_to_every_process() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handle = await c.submit({"text": "hi"}, request_id="r1")
        await handle.abort()
        await handle.abort()  # already finished: nothing more is sent
        with pytest.raises(RequestAborted):
            await handle.result()
        await until(lambda: all(m.Abort(("r1",)) in p.heard for p in stub.processes.values()))
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

    run(body, LaunchConfig(ready_timeout=5.0, request_timeout=0.3))


def test_a_full_inbox_holds_admission_until_it_drains() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        holds: list[bool] = []
        c.on_backpressure = holds.append
        stub.processes["voice#1"].send(m.InboxState("voice#1", "talk", True))
        stub.processes["prep"].send(m.InboxState("prep", "prep", True))
        await until(lambda: len(c.full_inboxes) == 2)
        stub.processes["prep"].send(m.InboxState("prep", "prep", False))
        stub.processes["voice#1"].send(m.InboxState("voice#1", "talk", False))
        await until(lambda: holds == [True, False])
        stub.processes["voice#0"].send(m.InboxState("voice#0", "talk", True))
        await until(lambda: holds == [True, False, True])
        stub.die("voice#0")  # its queue died with it: admission resumes
        assert holds == [True, False, True, False]

    run(body)


# --- deaths and restarts ----------------------------------------------------------------


def test_a_dead_replica_fails_its_requests_and_the_others_keep_serving() -> None:
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
            await (first if doomed == "a" else second).result()
        assert c.health() == ("degraded", {"voice#0": c.down["voice#0"]})
        await until(lambda: m.ProcessLost("voice#0") in stub.processes["prep"].heard)
        heard = stub.processes["prep"].heard
        assert heard.index(m.Abort((doomed,))) < heard.index(m.ProcessLost("voice#0"))
        stub.processes["voice#1"].send(result(survivor, {"text": "ok"}))
        assert await asyncio.wait_for((second if doomed == "a" else first).result(), 3) == {"talk": {"text": "ok"}}
        late = await c.submit({}, request_id="c")
        assert c.placement._assigned[late.id]["voice"] == "voice#1"
        assert c.lost == {"voice#0"}  # no restart allowed (max_restarts 0)

    run(body, LaunchConfig(ready_timeout=5.0, replay_limit=0))


def test_a_dead_replica_s_unseen_requests_are_replayed_from_the_entry_on_the_other() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        handles = [await c.submit({"n": i}, request_id=f"r{i}") for i in range(4)]
        doomed = [rid for rid, chosen in c.placement._assigned.items() if chosen["voice"] == "voice#0"]
        assert len(doomed) == 2
        stub.die("voice#0")
        prep = stub.processes["prep"]
        await until(lambda: len(prep.received) >= 6)
        replays = [message for message, _ in prep.received[4:]]
        # arrival order, from the entry, with the inputs the caller gave, on the live replica
        assert [s.ctx.request_id for s in replays] == [f"{rid}~1" for rid in doomed]
        assert all(s.dst == "prep" and s.ctx.replicas == {"voice": 1} for s in replays)
        assert [decode(s.payload, SegmentReader(), False) for s in replays] == [
            {"n": int(rid[1:])} for rid in doomed]
        await until(lambda: m.ProcessLost("voice#0") in prep.heard)
        assert prep.heard.index(m.Abort((doomed[0],))) < prep.heard.index(m.ProcessLost("voice#0"))
        for handle in handles:
            wire = f"{handle.id}~1" if handle.id in doomed else handle.id
            stub.processes["voice#1"].send(result(wire, {"text": handle.id}))
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 3)
        assert outcomes == [{"talk": {"text": f"r{i}"}} for i in range(4)]
        assert c.core.held()["requests"] == 0

    run(body)


def test_a_dead_process_restarts_and_hears_the_aborts_it_missed() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        await c.submit({}, request_id="r1")
        stub.die("prep")
        assert c.down and not c.healthy
        await until(lambda: stub.starts.count("prep") == 2 and c.healthy)
        assert stub.handles["prep"].restarts == 1
        await until(lambda: m.Abort(("r1",)) in stub.processes["prep"].heard)  # the new one heard it
        assert c.dead_reason is None

    run(body, LaunchConfig(ready_timeout=5.0, max_restarts=1))


def test_a_restart_that_never_gets_ready_is_killed_and_the_pipeline_dies_with_no_restart_left() -> None:
    async def body(c: Coordinator, stub: StubLauncher) -> None:
        stub.ready_on_start = False
        stub.die("prep", "exit code 1")
        await until(lambda: c.dead_reason is not None, timeout=3)
        assert stub.handles["prep"].killed
        assert "stage process 'prep' could not be restarted" in (c.dead_reason or "")
        with pytest.raises(PipelineDead, match="could not be restarted"):
            await c.submit({})
        assert c.health()[0] == "down"

    run(body, LaunchConfig(ready_timeout=0.3, max_restarts=1))


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
        c = Coordinator(loads(TOPOLOGY), LaunchConfig(ready_timeout=5.0),
                        launcher=lambda coordinator: stubs.append(StubLauncher(coordinator)) or stubs[0])
        await c.start()
        handle = await c.submit({}, request_id="r1")
        await c.close()
        with pytest.raises(RequestAborted, match="the pipeline shut down"):
            await handle.result()
        assert stubs[0].stopped and not c.socket_dir.exists()

    asyncio.run(main())
