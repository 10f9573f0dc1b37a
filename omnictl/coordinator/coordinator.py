"""The coordinator: the one place that knows where every request is.

It submits requests to the entry stage, tracks their state, merges terminal outputs,
broadcasts aborts (PUB/SUB, to every stage at once), watches the stage processes and
enforces per-request deadlines. It never sees intermediate payloads: tensors travel
stage to stage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Container, Mapping, Sequence

import zmq
import zmq.asyncio
from zmq.auth.thread import ThreadAuthenticator

from omnictl import messages as m
from omnictl.coordinator.launcher import Launcher
from omnictl.coordinator.ray_launcher import RayHandle, RayLauncher
from omnictl.coordinator.placement import ReplicaPlacement
from omnictl.coordinator.stats import node_stats, stage_stats
from omnictl.coordinator.pruning import active_stages, select_terminals
from omnictl.coordinator.request import RequestEvent, RequestEventKind, RequestHandle, RequestRecord, RequestState
from omnictl.exceptions import InvalidRequest, LaunchError, PipelineDead, RequestAborted, RequestFailed
from omnictl.profiling.events import EventKind, MetaValue, NullProfiler, Profiler
from omnictl.recent import RecentIds
from omnictl.schedulers.simple import describe_error
from omnictl.topology.model import RelayKnobs, Topology, Transport
from omnictl.transports.codec import PayloadCodec, codec_for, decode
from omnictl.transports.curve import CurveKeys, start_authenticator
from omnictl.transports.drain import Drain, Outgoing
from omnictl.transports.shm import SegmentReader, SlotPool

# A reused request id is refused for as long as it is remembered; a client may reuse one long
# after it finished, so the coordinator remembers more than a stage (DEFAULT_RECENT_IDS): ~17 MB for uuid-hex ids.
_RECENT_IDS = 100_000
_LAUNCH_REPORT_GRACE_S = 0.5  # how long a dead process's launch report may still arrive
log = logging.getLogger(__name__)


def resolve_data_host(data_host: str | None, launcher: str) -> str:
    """The address tcp sockets bind and advertise here: given, ``$OMNICTL_DATA_HOST``, this
    node's Ray address (``ray``), or 127.0.0.1 (``local``)."""
    override = data_host or os.environ.get("OMNICTL_DATA_HOST")
    if override:
        return override
    if launcher == "ray":
        import ray

        return str(ray.util.get_node_ip_address())
    return "127.0.0.1"


class Coordinator:
    def __init__(
        self,
        topology: Topology,
        *,
        model_path: str | None = None,
        profiler: Profiler | None = None,
        profile_address: str | None = None,
        request_timeout: float = 300.0,
        ready_timeout: float = 120.0,
        max_restarts: int = 0,
        socket_dir: Path | None = None,
        run_dir: Path | None = None,
        data_host: str | None = None,
        launcher: str = "local",
        ray_address: str | None = None,
        curve: CurveKeys | None = None,
        profile_tcp_address: str | None = None,
    ) -> None:
        """``data_host``: the address tcp sockets bind and advertise (multi-node topologies, and
        every socket under Ray); default ``$OMNICTL_DATA_HOST``, else 127.0.0.1 (the local
        launcher) or each node's Ray address. ``launcher``: ``local`` (OS processes) or ``ray``.
        ``curve``: the launch's keys when the caller made them (the profiling collector shares
        them); ``profile_tcp_address``: the collector's tcp address for workers on other nodes."""
        if launcher not in ("local", "ray"):
            raise ValueError(f"launcher must be 'local' or 'ray', not {launcher!r}")
        self.topology = topology
        self.model_path = model_path if model_path is not None else topology.model_path
        self.profiler = profiler or NullProfiler()
        self.request_timeout = request_timeout
        self.ready_timeout = ready_timeout
        self.max_restarts = max_restarts
        self.requests: dict[str, RequestRecord] = {}
        self._recent = RecentIds(_RECENT_IDS)  # finished ids, refused if reused
        self.down: dict[str, str] = {}  # OS process (replica) -> why it is down
        # Replicas up but not answering stats (frozen, loop stuck: the server's liveness
        # check sets this): new requests are pinned to the other replicas, as if down.
        self.unresponsive: frozenset[str] = frozenset()
        self.lost: set[str] = set()  # replicas down for good (no restart left)
        self.placement = ReplicaPlacement(topology)
        self.dead_reason: str | None = None
        # Removed on close. Short paths: ipc:// addresses are limited to ~100 bytes.
        self.socket_dir = socket_dir or Path(tempfile.mkdtemp(prefix="omnictl-"))
        self._process_addresses = {
            name: f"ipc://{self.socket_dir}/p{i}" for i, name in enumerate(topology.instances())
        }
        self._context = zmq.asyncio.Context()
        # Plain sockets on the same context for the hot path: sends never block (no
        # high-water mark), and receiving drains every ready message per wake-up.
        self._sync_context = zmq.Context.shadow(self._context.underlying)
        self._control = self._sync_context.socket(zmq.PULL)
        self._control.bind(f"ipc://{self.socket_dir}/control")
        self._broadcast = self._context.socket(zmq.PUB)
        self._broadcast.setsockopt(zmq.SNDHWM, 0)
        self._broadcast.bind(f"ipc://{self.socket_dir}/broadcast")
        override = data_host or os.environ.get("OMNICTL_DATA_HOST")
        self.data_host = resolve_data_host(data_host, launcher)
        self.remote = launcher == "ray"  # every process is reached over tcp
        tcp_coordinator: tuple[str, str] | None = None
        self.curve: CurveKeys | None = None
        self._authenticator: ThreadAuthenticator | None = None
        if topology.multi_node() or self.remote:  # processes on labelled nodes reach the coordinator over tcp
            self.curve = curve or CurveKeys.generate()  # this launch's; workers get them with their config
            self._authenticator = start_authenticator(zmq.Context.shadow(self._context.underlying), self.curve)
            tcp_coordinator = (self._bind_tcp(self._control), self._bind_tcp(self._broadcast))
        self._tcp_addresses: dict[str, str] = {}  # OS process -> the tcp:// address it reported
        self._pushes: dict[str, zmq.Socket] = {}
        self._drain: Drain | None = None
        self._active: dict[tuple[str, ...], tuple[str, ...]] = {}  # terminals -> stages that run
        self._out = Outgoing()  # several messages per send to each socket, per loop iteration
        self._pool = SlotPool(m.COORDINATOR, m.COORDINATOR, RelayKnobs().slot_bytes, 4)
        self._codec = PayloadCodec(self._pool, RelayKnobs(), topology.allow_pickle)
        self._reader = SegmentReader()
        self._stats_seq = itertools.count()
        self._stats_waiters: dict[int, tuple[asyncio.Future[None], dict[str, m.StatsReply]]] = {}
        self._hello_acks: set[str] = set()
        # Backpressure: (OS process, stage) whose inbox is full. While any is, `on_backpressure(True)`
        # tells admission to hold new requests (Pipeline wires it to Admission.hold).
        self.full_inboxes: set[tuple[str, str]] = set()
        self.on_backpressure: Callable[[bool], None] = lambda full: None
        self._tasks: list[asyncio.Task[None]] = []
        self.launcher: Launcher | RayLauncher
        if self.remote:
            assert tcp_coordinator is not None and self.curve is not None
            self.launcher = RayLauncher(topology, self.model_path, tcp_coordinator, profile_tcp_address,
                                        self._process_exited, self.curve, ray_address, override)
        else:
            self.launcher = Launcher(
                topology,
                self.model_path,
                self._process_addresses,
                f"ipc://{self.socket_dir}/control",
                f"ipc://{self.socket_dir}/broadcast",
                profile_address,
                self._process_exited,
                tcp_coordinator,
                self.data_host,
                self.curve,
                profile_tcp_address,
                run_dir,
            )
        self._tcp_codec: PayloadCodec | None = None
        if self.topology.node_of(self.topology.entry) is not None:  # inputs go to another node
            self._tcp_codec = codec_for(Transport.TCP, self._pool, RelayKnobs())

    def _bind_tcp(self, socket: zmq.Socket) -> str:
        assert self.curve is not None
        self.curve.serve(socket)  # the ipc endpoint bound before keeps no security
        socket.bind(f"tcp://{self.data_host}:*")
        return socket.getsockopt_string(zmq.LAST_ENDPOINT)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._drain = Drain(self._control, m.coordinator_decoder.decode, self._receive, "coordinator")
        self._tasks.append(asyncio.create_task(self._enforce_deadlines(), name="coordinator.deadlines"))
        instances = list(self.topology.instances())
        handles = [self.launcher.start(name) for name in instances]
        async def all_ready() -> None:
            await asyncio.gather(*(h.ready for h in handles))
            await self._handshake(instances)

        try:
            await asyncio.wait_for(all_ready(), self.ready_timeout)
        except asyncio.TimeoutError:
            waiting = [h.name for h in handles if not h.ready.done()] or instances
            raise LaunchError(
                self._first_stage(waiting[0]),
                f"process {waiting[0]!r} was not ready within {self.ready_timeout:.0f}s",
            ) from None

    def _first_stage(self, instance: str) -> str:
        return self.topology.processes[self.launcher.process_of[instance]].stages[0]

    async def _handshake(self, processes: list[str]) -> None:
        """PUB/SUB drops messages until a subscription is in place: say hello until
        every process has answered, so no abort can be lost."""
        self._hello_acks.clear()
        seq = 0
        while not set(processes) <= self._hello_acks:
            for process in processes:
                handle = self.launcher.handles[process]
                if not handle.alive():
                    why = f"process {process!r} exited: {handle.describe_exit()}"
                    raise LaunchError(self._first_stage(process), why)
            self._broadcast.send(m.encode(m.Hello(seq, self._tcp_addresses)))
            seq += 1
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for record in list(self.requests.values()):
            self._finish(record, RequestState.ABORTED, RequestAborted(record.request_id, "the pipeline shut down"))
        await self.launcher.stop()
        for task in self._tasks:
            task.cancel()
        if self._drain is not None:
            self._drain.close()
        self._out.flush()
        for socket in [self._control, self._broadcast, *self._pushes.values()]:
            socket.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        self._context.term()
        self._reader.close()
        self._pool.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    # --- requests ---------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Every replica of every process is up."""
        return not self.down and self.dead_reason is None

    def health(self) -> tuple[str, dict[str, str]]:
        """``ok``; ``degraded`` while every process has a replica up but some replica is
        down; ``down`` when some process has none (or the pipeline is dead). With the
        down replicas and why."""
        if self.dead_reason is not None or any(
            all(name in self.down for name in p.instances) for p in self.topology.processes.values()
        ):
            return "down", dict(self.down)
        return ("degraded" if self.down else "ok"), dict(self.down)

    def _push(self, process: str) -> zmq.Socket:
        socket = self._pushes.get(process)
        if socket is None:
            socket = self._pushes[process] = self._sync_context.socket(zmq.PUSH)
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.LINGER, 0)
            node = self.launcher.node_of[process]
            tcp = node is not None or self.remote
            if tcp and self.curve is not None:
                self.curve.connect_as_client(socket)
            socket.connect(self._tcp_addresses[process] if tcp else self._process_addresses[process])
        return socket

    async def submit(
        self,
        inputs: Any,
        modalities: Sequence[str] | None = None,
        request_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        trace_parent: Mapping[str, MetaValue] | None = None,
    ) -> RequestHandle:
        """``params`` (msgpack-plain): what every stage sees of the request besides its data
        (``sampling``, ``voice``); :meth:`Pipeline.submit` derives them from the inputs.
        ``trace_parent``: the caller's span (see :mod:`omnictl.telemetry.traceparent`),
        recorded with the admission for the OTLP export."""
        if self.dead_reason is not None:
            raise PipelineDead(self.dead_reason)
        terminals = select_terminals(self.topology, modalities)
        active = self._active.get(terminals)
        if active is None:  # one graph walk per selection of terminals, not per request
            active = self._active[terminals] = active_stages(self.topology, terminals)
        rid = request_id or uuid.uuid4().hex
        if rid in self.requests or rid in self._recent:
            # Stages drop late messages of finished ids, so a reused id would never complete.
            raise InvalidRequest(f"request id {rid!r} was already used; ids must be unique", field="request_id")
        context_params = {**(params or {}), "modalities": sorted({self.topology.terminals[t] for t in terminals})}
        entry = self.topology.entry
        try:
            replicas = self.placement.assign(rid, active, _Either(self.down, self.unresponsive))
        except PipelineDead as exc:
            raise PipelineDead(f"{exc}: {'; '.join(self.down.values())}") from exc
        try:
            # before registering: inputs that cannot be sent leave no trace
            payload, frames = (self._tcp_codec or self._codec).encode_frames(inputs)
        except BaseException:
            self.placement.release(rid)
            raise
        ctx = m.RequestContext(rid, context_params, active, replicas)
        loop = asyncio.get_running_loop()
        record = RequestRecord(rid, set(terminals), active, loop.time() + self.request_timeout)
        self.requests[rid] = record
        self.profiler.record(EventKind.ADMITTED, rid, None, terminals=",".join(terminals), **(trace_parent or {}))
        record.state = RequestState.RUNNING
        process = self.topology.processes[self.topology.process_of(entry)]
        instance = process.instances[replicas.get(process.name, 0)]
        if payload.shm is not None:
            self._pool.sent(payload.shm, instance)  # taken back if that process dies before releasing it
        self._out.send(self._push(instance), m.encode(m.Submit(ctx, entry, payload)), frames)
        return RequestHandle(record, self.abort)

    async def abort(self, request_id: str) -> None:
        record = self.requests.get(request_id)
        if record is None:
            return
        self._finish(record, RequestState.ABORTED, RequestAborted(request_id, f"request {request_id} was aborted"))

    def _finish(
        self,
        record: RequestRecord,
        state: RequestState,
        error: RequestFailed | RequestAborted | None = None,
        rejected: bool = False,
    ) -> None:
        if record.finished:
            return
        self.requests.pop(record.request_id, None)
        self.placement.release(record.request_id)
        self._recent.add(record.request_id)
        if state is RequestState.COMPLETED:
            self.profiler.record(EventKind.COMPLETED, record.request_id, None)
        else:
            # Every stage drops what it holds for this request, at once.
            self._broadcast.send(m.encode(m.Abort((record.request_id,))))
            kind = EventKind.ABORTED if state is RequestState.ABORTED else EventKind.FAILED
            # `rejected`: the stage refused the input; the dashboard counts it apart from failures
            meta = {"error": str(error), "rejected": True} if rejected else {"error": str(error)}
            self.profiler.record(kind, record.request_id, error.stage if error else None, **meta)
        record.finish(state, error)

    def _fail(self, request_id: str, stage: str | None, message: str, rejected: bool = False,
              field: str | None = None) -> None:
        record = self.requests.get(request_id)
        if record is not None:
            self._finish(record, RequestState.FAILED, RequestFailed(request_id, message, stage, field), rejected)

    async def _enforce_deadlines(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.2)
            now = loop.time()
            for record in [r for r in self.requests.values() if r.deadline <= now]:
                self._fail(
                    record.request_id,
                    None,
                    f"request {record.request_id} missed its deadline of {self.request_timeout:g}s; "
                    f"terminals still expected: {sorted(record.expected)}",
                )

    # --- control messages -------------------------------------------------------------

    def _receive(self, message: m.ToCoordinator, frames: list[memoryview]) -> None:  # type: ignore[valid-type]
        if isinstance(message, m.TerminalOutput):
            self._terminal_output(message, frames)  # frames: a tcp terminal output's tensors
        else:
            self._handle(message)

    def _handle(self, message: m.ToCoordinator) -> None:  # type: ignore[valid-type]
        if isinstance(message, m.StageFailed):
            self._fail(message.request_id, message.stage, message.error, message.rejected, message.field)
        elif isinstance(message, m.TerminalSkipped):
            record = self.requests.get(message.request_id)
            if record is not None:
                record.expected.discard(message.stage)
                self._maybe_complete(record)
        elif isinstance(message, m.SlotRelease):
            self._pool.release(message.ref)
        elif isinstance(message, m.Ready):
            if message.tcp_address:
                self._tcp_address(message.process, message.tcp_address)
            handle = self.launcher.handles.get(message.process)
            if handle is not None and not handle.ready.done():
                if isinstance(handle, RayHandle):
                    handle.pid = message.pid
                handle.ready.set_result(None)
        elif isinstance(message, m.LaunchFailed):
            handle = self.launcher.handles.get(message.process)
            if handle is not None and not handle.ready.done():
                handle.ready.set_exception(LaunchError(message.stage, message.error))
        elif isinstance(message, m.HelloAck):
            self._hello_acks.add(message.process)
        elif isinstance(message, m.InboxState):
            self._set_inbox(message.process, message.stage, message.full)
        elif isinstance(message, m.StatsReply):
            waiter = self._stats_waiters.get(message.seq)
            if waiter is not None:
                done, replies = waiter
                replies[message.process] = message
                live = {p for p in self.launcher.process_of if p not in self.down}
                if live <= set(replies) and not done.done():
                    done.set_result(None)

    def _tcp_address(self, process: str, address: str) -> None:
        """A (re)started process's tcp address: the next hello hands it to every peer."""
        if self._tcp_addresses.get(process, address) != address and process in self._pushes:
            self._close_push(process)
        self._tcp_addresses[process] = address
        self.launcher.tcp_ports[process] = int(address.rsplit(":", 1)[1])

    def _terminal_output(self, message: m.TerminalOutput, frames: list[memoryview]) -> None:
        try:
            data = decode(message.payload, self._reader, self.topology.allow_pickle, frames=frames)
        except Exception as exc:  # e.g. an object that pickles but does not unpickle: this request fails
            self._fail(message.request_id, message.stage,
                       f"the output of stage {message.stage!r} could not be decoded: {describe_error(exc)}")
            return
        finally:
            if message.payload.shm is not None:
                self._out.send(self._push(message.payload.shm.owner), m.encode(m.SlotRelease(message.payload.shm)))
        record = self.requests.get(message.request_id)
        if record is None:
            return  # finished (aborted, failed) while this was in flight
        if message.seq == 0:  # the terminal's first output: its first chunk, or a result that never streamed
            self._mark_first_output(message.request_id, message.stage)
        if message.final:
            record.results[message.stage] = data
            record.expected.discard(message.stage)
            record.events.put_nowait(RequestEvent(RequestEventKind.RESULT, message.stage, data))
            self.profiler.record(EventKind.TERMINAL_COMPLETE, message.request_id, message.stage)
            self._maybe_complete(record)
        else:
            record.events.put_nowait(RequestEvent(RequestEventKind.STREAM, message.stage, data))

    def _mark_first_output(self, request_id: str, stage: str) -> None:
        modality = self.topology.terminals[stage]
        if modality == "text":
            self.profiler.record(EventKind.FIRST_TEXT, request_id, stage)
        elif modality == "audio":
            self.profiler.record(EventKind.FIRST_AUDIO, request_id, stage)

    def _maybe_complete(self, record: RequestRecord) -> None:
        if record.expected:
            return
        if record.results:
            self._finish(record, RequestState.COMPLETED)
        else:
            self._fail(record.request_id, None, "no terminal produced a result: every branch was skipped")

    def _set_inbox(self, process: str, stage: str, full: bool) -> None:
        was = bool(self.full_inboxes)
        if full:
            self.full_inboxes.add((process, stage))
        else:
            self.full_inboxes.discard((process, stage))
        if bool(self.full_inboxes) != was:
            self.on_backpressure(not was)

    # --- faults -----------------------------------------------------------------------

    def _process_exited(self, instance: str, exit_description: str) -> None:
        """``instance`` (a process, or one replica of it) died: fail the requests pinned to
        it, restart it if the policy allows; the other replicas keep serving."""
        process = self.topology.processes[self.launcher.process_of[instance]]
        label = f"replica {instance!r}" if process.replicas > 1 else f"stage process {instance!r}"
        where = f", node {process.node!r}" if process.node is not None else ""
        why = f"{label} (stages {', '.join(process.stages)}{where}) died: {exit_description}"
        self.down[instance] = why
        self._reader.drop_dead()  # its segments are unlinked: unmap them here, or their memory stays
        for process_name, stage in [key for key in self.full_inboxes if key[0] == instance]:
            self._set_inbox(process_name, stage, False)  # its queue died with it
        handle = self.launcher.handles[instance]
        if not handle.ready.done():
            # A stage that failed to build sends why (LaunchFailed) just before it exits, and
            # its exit can be seen first: give that report a moment to win over "died".
            asyncio.get_running_loop().call_later(
                _LAUNCH_REPORT_GRACE_S, _fail_launch, handle.ready, LaunchError(process.stages[0], why)
            )
        failed = self.placement.holders(instance)
        for request_id in failed:
            record = self.requests.get(request_id)
            if record is None:
                continue
            stage = next((s for s in process.stages if s in record.active), process.stages[0])
            self._fail(request_id, stage, f"stage {stage!r} failed: {why}")
        self._take_back(instance)
        # Logged once, here: the death, what it cost and what happens next (each request it
        # failed is logged by whoever answers it).
        if handle.restarts < self.max_restarts:
            log.error("%s; %d request(s) pinned to it failed; restarting it (restart %d of %d)", why, len(failed),
                      handle.restarts + 1, self.max_restarts)
            asyncio.get_running_loop().create_task(self._restart(instance, failed))
        else:
            log.error("%s; %d request(s) pinned to it failed; no restart left (max_restarts %d)", why, len(failed),
                      self.max_restarts)
            self._lose(instance, why)

    def _take_back(self, instance: str) -> None:
        """What was sent to the dead ``instance`` and not read is lost with it: drop the
        socket to it (its queue held only the failed requests' messages, which must not
        reach the replacement and release reused slots) and take back the slots, here and,
        after the aborts just sent, in every stage process."""
        self._close_push(instance)
        self._pool.reclaim(instance)
        self._broadcast.send(m.encode(m.ProcessLost(instance)))

    def _close_push(self, instance: str) -> None:
        socket = self._pushes.pop(instance, None)
        if socket is not None:
            self._out.discard(socket)
            socket.close(linger=0)

    def _lose(self, instance: str, why: str) -> None:
        """No restart left for ``instance``: the pipeline is dead once a process has lost
        every replica."""
        self.lost.add(instance)
        process = self.topology.processes[self.launcher.process_of[instance]]
        if all(name in self.lost for name in process.instances):
            self.dead_reason = why

    async def _restart(self, instance: str, failed: list[str]) -> None:
        handle = self.launcher.start(instance)
        try:
            await asyncio.wait_for(handle.ready, self.ready_timeout)
            await asyncio.wait_for(self._handshake([instance]), self.ready_timeout)
        except (LaunchError, asyncio.TimeoutError) as exc:
            if handle.alive():  # hung rather than exited: no exit will trigger another try
                handle.kill()
            log.error("stage process %r could not be restarted: %s", instance, exc)
            if handle.restarts >= self.max_restarts:
                self._lose(instance, f"stage process {instance!r} could not be restarted: {exc}")
            return  # otherwise its exit starts the next restart
        if failed:
            # The new process never heard the aborts for what its predecessor held: data
            # for those requests still in flight must not build state there.
            self._broadcast.send(m.encode(m.Abort(tuple(failed))))
        self.down.pop(instance, None)
        log.info("stage process %r is back", instance)

    # --- introspection ----------------------------------------------------------------

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Per node label: its OS processes and whether they are up (see node_stats)."""
        return node_stats(self.topology, self.down)

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """Per stage: status and the state it holds, over its replicas (see stage_stats)."""
        seq = next(self._stats_seq)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        replies: dict[str, m.StatsReply] = {}
        self._stats_waiters[seq] = (done, replies)
        try:
            if set(self.launcher.process_of) - set(self.down):
                await self._broadcast.send(m.encode(m.StatsRequest(seq)))
                await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            pass  # report what answered; the rest shows as unknown
        finally:
            del self._stats_waiters[seq]
        return stage_stats(self.topology, replies, self.down)


def _fail_launch(ready: "asyncio.Future[None]", error: LaunchError) -> None:
    if not ready.done():
        ready.set_exception(error)


class _Either:
    """``name in _Either(a, b)``: in either container (without building their union per request)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[str], b: Container[str]) -> None:
        self.a, self.b = a, b

    def __contains__(self, name: object) -> bool:
        return name in self.a or name in self.b
