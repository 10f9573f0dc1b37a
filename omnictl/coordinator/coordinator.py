"""The coordinator process's shell: the wire and the launcher around :class:`CoordinatorCore`.

The core (:mod:`omnictl.coordinator.core`) is the one place that knows where every request
is; this shell feeds it what arrives (control messages, process exits, the clock) and does
what it returns: broadcasts aborts (PUB/SUB, to every stage at once), sends submits to the
entry stage, restarts processes. It never sees intermediate payloads: tensors travel stage
to stage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
from typing import Any, Callable, Mapping, Sequence

from omnictl import messages as m
from omnictl.coordinator.autoscale import Autoscaler, ScaleDecision
from omnictl.coordinator.core import Admitted, Broadcast, CoordinatorCore
from omnictl.coordinator.launching import ProcessLauncher, build_launcher
from omnictl.coordinator.placement import ReplicaPlacement
from omnictl.coordinator.request import InputStream, RequestHandle, RequestRecord
from omnictl.coordinator.stats import node_stats, stage_stats
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import InputStalled, LaunchError, describe_error
from omnictl.launch_config import LaunchConfig
from omnictl.profiling.events import EventKind, MetaValue, NullProfiler, Profiler, now_ns
from omnictl.topology.model import RelayKnobs, Topology
from omnictl.transports import registry
from omnictl.transports.codec import decode
from omnictl.transports.drain import Drain
from omnictl.transports.endpoint import Endpoint
from omnictl.transports.registry import Placement
from omnictl.transports.shm import SegmentReader

_LAUNCH_REPORT_GRACE_S = 0.5  # how long a dead process's launch report may still arrive
# How often the autoscaler looks: a quarter of its shortest window (at most 0.25 s), so a
# window passes within a few ticks of its length; each look is a few sums.
_AUTOSCALE_TICK_S = 0.25
_AUTOSCALE_MIN_TICK_S = 0.02
log = logging.getLogger(__name__)


def _default_launcher(coordinator: Coordinator) -> ProcessLauncher:
    return build_launcher(coordinator.topology, coordinator.config, coordinator.wiring, coordinator.on_process_exit)


class Coordinator:
    def __init__(
        self,
        topology: Topology,
        config: LaunchConfig,
        wiring: Wiring | None = None,
        *,
        profiler: Profiler | None = None,
        launcher: Callable[[Coordinator], ProcessLauncher] | None = None,
    ) -> None:
        """``config``: the launch's knobs, whole. ``wiring``: its addresses, keys and data
        host, resolved by the caller (the profiling collector shares them); default: resolved
        here, in a fresh temporary socket directory. ``launcher``: builds the launcher from
        this coordinator (its ``wiring`` and ``on_process_exit``); default:
        :func:`~omnictl.coordinator.launching.build_launcher`, as ``config`` says."""
        self.config = config
        self.topology = topology
        self.profiler = profiler or NullProfiler()
        self.core = CoordinatorCore(
            topology,
            request_timeout=config.request_timeout,
            profiler=self.profiler,
            replay_limit=config.faults.replay_limit,
        )
        self.ready_timeout = config.ready_timeout
        self.max_restarts = config.faults.max_restarts
        wiring = wiring or Wiring.resolve(topology, config)
        self.socket_dir = wiring.socket_dir  # removed on close
        # Under Ray every process is reached over tcp: no ipc address book.
        self.endpoint = Endpoint(
            m.COORDINATOR,
            topology.wire_layout(),
            ipc_addresses={} if config.remote else wiring.process_addresses,
            curve=wiring.curve,
        )
        self._control = self.endpoint.pull(wiring.control_address)
        self._broadcast = self.endpoint.publisher(wiring.broadcast_address)
        if wiring.curve is not None:  # processes on labelled nodes reach the coordinator over tcp
            tcp = self.endpoint.bind_tcp(self._control, wiring.data_host)
            wiring = wiring.with_tcp(coordinator=(tcp, self.endpoint.bind_tcp(self._broadcast, wiring.data_host)))
        self.wiring = wiring
        self._drain: Drain | None = None
        # The coordinator lends slots only for entry inputs: a few, of the default size.
        knobs = RelayKnobs(slots=4)
        self._pool = self.endpoint.pool(m.COORDINATOR, knobs)
        # as an edge from a CPU stage on the unlabelled node to the entry stage
        entry = topology.stages[topology.entry]
        entry_transport = registry.select(Placement(False, None, topology.node_of(entry.name), (), tuple(entry.gpu)))
        self._entry_transport = entry_transport
        self._codec = self.endpoint.codec(m.COORDINATOR, entry_transport, knobs)
        self._reader = SegmentReader()
        self._stats_seq = itertools.count()
        self._stats_waiters: dict[int, tuple[asyncio.Future[None], dict[str, m.StatsReply]]] = {}
        self._hello_acks: set[str] = set()
        # Streamed inputs' backpressure: a request's send() waits while `input_window` of its
        # chunks are not taken by the entry (InputTaken), at most `input_wait` s; woken here.
        self.input_window = config.input_window
        self.input_wait = config.input_wait
        self._credit: dict[str, asyncio.Event] = {}
        # Backpressure: while some stage inbox is full (core.full_inboxes), `on_backpressure(True)`
        # tells admission to hold new requests (Pipeline wires it to Admission.hold).
        self.on_backpressure: Callable[[bool], None] = lambda full: None
        self._tasks: list[asyncio.Task[None]] = []
        self.autoscaler = Autoscaler(topology)
        self._starting: set[str] = set()  # standby replicas the autoscaler is starting
        self._retiring: set[str] = set()  # drained replicas being stopped
        self.launcher: ProcessLauncher = (launcher or _default_launcher)(self)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._drain = Drain(self._control, m.coordinator_decoder.decode, self._receive, "coordinator")
        self._tasks.append(asyncio.create_task(self._enforce_deadlines(), name="coordinator.deadlines"))
        if self.autoscaler.processes:
            self._tasks.append(asyncio.create_task(self._autoscale(), name="coordinator.autoscale"))
        # an elastic process starts with its `min` replicas; the others wait in standby
        instances = [name for name in self.topology.instances() if name not in self.core.standby]
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
                f"process {waiting[0]!r} was not ready within {self.ready_timeout:g}s",
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
            self._broadcast.send(m.encode(m.Hello(seq, self.endpoint.tcp_addresses)))
            seq += 1
            await asyncio.sleep(0.01)

    # --- the core's state, as the pipeline and tests read it --------------------------------

    @property
    def requests(self) -> dict[str, RequestRecord]:
        return self.core.requests

    @property
    def down(self) -> dict[str, str]:
        return self.core.down

    @property
    def lost(self) -> set[str]:
        return self.core.lost

    @property
    def placement(self) -> ReplicaPlacement:
        return self.core.placement

    @property
    def dead_reason(self) -> str | None:
        return self.core.dead_reason

    @property
    def full_inboxes(self) -> set[tuple[str, str]]:
        return self.core.full_inboxes

    @property
    def unresponsive(self) -> frozenset[str]:
        """Replicas new requests avoid (see :meth:`omnictl.Pipeline.avoid`)."""
        return self.core.unresponsive

    @unresponsive.setter
    def unresponsive(self, instances: frozenset[str]) -> None:
        self.core.unresponsive = instances

    def _broadcast_all(self, broadcasts: list[Broadcast]) -> None:
        for message in broadcasts:
            self._broadcast.send(m.encode(message))

    async def close(self) -> None:
        self._broadcast_all(self.core.shutdown())
        await self.launcher.stop()
        for task in self._tasks:
            task.cancel()
        if self._drain is not None:
            self._drain.close()
        self.endpoint.close()
        self._reader.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    # --- requests ---------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Every replica of every process is up."""
        return self.core.healthy

    def health(self) -> tuple[str, dict[str, str]]:
        """See :meth:`CoordinatorCore.health`."""
        return self.core.health()

    async def submit(
        self,
        inputs: Any,
        modalities: Sequence[str] | None = None,
        request_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        trace_parent: Mapping[str, MetaValue] | None = None,
        stream: bool = True,
        input_stream: bool = False,
    ) -> RequestHandle:
        """``params`` (msgpack-plain): what every stage sees of the request besides its data
        (``sampling``, ``voice``); :meth:`Pipeline.submit` derives them from the inputs.
        ``trace_parent``: the caller's span (see :mod:`omnictl.telemetry.traceparent`),
        recorded with the admission for the OTLP export. ``input_stream``: the input arrives
        over time, through the handle (:meth:`send_input`); ``inputs``, unless None, is its
        first chunk."""
        admitted = self.core.admit(asyncio.get_running_loop().time(), modalities, request_id, params, trace_parent)
        try:
            # before anything is sent: inputs that cannot be sent leave no trace
            encoded = None if input_stream and inputs is None else self._codec.encode_frames(inputs)
        except BaseException:
            self.core.withdraw(admitted)
            raise
        self.core.commit(admitted, inputs, stream, input_stream)
        if not input_stream:
            assert encoded is not None
            self._send_submit(admitted, *encoded)
        elif encoded is not None:
            self._send_chunk(admitted.record, inputs, *encoded)
        return RequestHandle(admitted.record, self.abort, self if input_stream else None)

    def _send_submit(self, admitted: Admitted, payload: m.EncodedPayload, frames: list[memoryview]) -> None:
        # a shm payload's slot is taken back if that process dies before releasing it
        self.endpoint.send_to(
            admitted.instance,
            m.Submit(admitted.context, admitted.entry, payload),
            frames,
            payload,
            lender=m.COORDINATOR,
        )

    # --- streamed input: the caller's chunks, straight to the entry stage ------------------

    def send_input(self, record: RequestRecord, data: Any) -> None:
        """The next chunk of ``record``'s streamed input (see :meth:`RequestHandle.send`).
        It is encoded here, in the caller's process, and pushed to the entry stage's process
        like a ``stream_to`` edge's chunk (in a shared-memory slot this process lends, or
        tcp frames): the core only counts it. Data that cannot be encoded raises before
        anything is sent or counted."""
        payload, frames = self._codec.encode_frames(data)
        self._send_chunk(record, data, payload, frames)

    def _send_chunk(
        self, record: RequestRecord, data: Any, payload: m.EncodedPayload, frames: list[memoryview]
    ) -> None:
        try:
            sending = self.core.next_chunk(record, data)
        except BaseException:
            self._unsent(payload)
            raise
        if sending is None:  # it waits for a replay, which sends it with the others (kept)
            self._unsent(payload)
            return
        self._push_chunk(*sending, payload, frames)

    async def input_credit(self, record: RequestRecord, timeout: float | None) -> None:
        """Return once ``record``'s input has room for a chunk (under ``input_window`` sent and
        not taken), or it has ended (the handle then raises its error); :class:`InputStalled`
        after ``timeout`` seconds (None: ``input_wait``) without room."""
        stream = record.input_stream
        assert stream is not None  # the handle checked it
        if stream.in_flight < self.input_window:
            return
        wait = self.input_wait if timeout is None else timeout
        credit = self._credit.get(record.request_id)
        if credit is None:
            credit = self._credit[record.request_id] = asyncio.Event()
            record.outcome.add_done_callback(lambda _: self._credit.pop(record.request_id, asyncio.Event()).set())
        deadline = asyncio.get_running_loop().time() + wait
        while stream.in_flight >= self.input_window and not record.finished:
            credit.clear()
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(credit.wait(), max(0.0, left))
            except TimeoutError:
                raise InputStalled(
                    f"request {record.request_id}: the entry stage {stream.entry!r} has not taken "
                    f"{stream.in_flight} chunks of its input (input_window {self.input_window}) in "
                    f"{wait:g} s; this chunk was not sent (the input stays open)",
                    retry_after=max(1, round(wait)),
                ) from None

    def _input_taken(self, message: m.InputTaken) -> None:
        record = self.core.input_taken(message.request_id, message.taken)
        if record is not None and record.request_id in self._credit:
            self._credit[record.request_id].set()

    def _unsent(self, payload: m.EncodedPayload) -> None:
        if payload.shm is not None:  # encoded for nothing: its slot goes back at once
            self._pool.release(payload.shm)

    def _push_chunk(self, stream: InputStream, seq: int, payload: m.EncodedPayload, frames: list[memoryview]) -> None:
        self.profiler.record(
            EventKind.STREAM_SENT,
            stream.context.request_id,
            None,  # recorded as this process's (m.INPUT_SOURCE): the entry's receive pairs with it
            target=stream.entry,
            seq=seq,
            transport=self._entry_transport.value,
            bytes=m.payload_bytes(payload),
        )
        chunk = m.StreamChunk(stream.context, m.INPUT_SOURCE, stream.entry, seq, payload, now_ns())
        self.endpoint.send_to(stream.instance, chunk, frames, payload, lender=m.COORDINATOR)

    def end_input(self, record: RequestRecord) -> None:
        """End ``record``'s streamed input: the entry stage gets the stream's end after its
        last chunk (the same socket, so in order)."""
        stream = self.core.end_input(record)
        if stream is not None:  # else it waits for a replay, which sends the end after the chunks
            self._end_stream(stream)

    def _end_stream(self, stream: InputStream) -> None:
        self.endpoint.send_to(stream.instance, m.StreamDone(stream.context, m.INPUT_SOURCE, stream.entry))

    def _replay(self) -> None:
        """Send every replay the core could place (arrival order: before any new request,
        which waits for this loop turn to end): its whole input again, or, for a streamed
        input, every chunk sent so far (and its end, if it came) to the new attempt."""
        for admitted in self.core.take_replays():
            record = admitted.record
            chunks = record.inputs if record.input_stream is not None else [record.inputs]
            encoded: list[tuple[m.EncodedPayload, list[memoryview]]] = []
            try:
                for chunk in chunks:
                    encoded.append(self._codec.encode_frames(chunk))
            except Exception as exc:  # encoded once already; a slot shortage or a changed object
                for payload, _ in encoded:
                    self._unsent(payload)
                self._broadcast_all(self.core.replay_failed(admitted, describe_error(exc)))
                continue
            stream = record.input_stream
            if stream is None:
                self._send_submit(admitted, *encoded[0])
                continue
            for seq, (payload, frames) in enumerate(encoded):
                self._push_chunk(stream, seq, payload, frames)
            if stream.ended:
                self._end_stream(stream)

    async def abort(self, request_id: str) -> None:
        self._broadcast_all(self.core.abort(request_id))

    def _fail(self, request_id: str, stage: str | None, message: str) -> None:
        self._broadcast_all(self.core.fail(request_id, stage, message))

    async def _enforce_deadlines(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.2)
            self._broadcast_all(self.core.expire(loop.time()))

    # --- control messages -------------------------------------------------------------

    def _receive(self, message: m.ToCoordinator, frames: list[memoryview]) -> None:
        if isinstance(message, m.TerminalOutput):
            self._terminal_output(message, frames)  # frames: a tcp terminal output's tensors
        else:
            self._handle(message)

    def _handle(self, message: m.ToCoordinator) -> None:
        if isinstance(message, (m.StageFailed, m.TerminalSkipped)):
            self._broadcast_all(self.core.stage_message(message))
        elif isinstance(message, m.SlotRelease):
            self._pool.release(message.ref)
        elif isinstance(message, m.Ready):
            if message.tcp_address:
                self._tcp_address(message.process, message.tcp_address)
            handle = self.launcher.handles.get(message.process)
            if handle is not None:
                handle.reported_ready(message.pid)
        elif isinstance(message, m.LaunchFailed):
            handle = self.launcher.handles.get(message.process)
            if handle is not None and not handle.ready.done():
                handle.ready.set_exception(LaunchError(message.stage, message.error))
        elif isinstance(message, m.HelloAck):
            self._hello_acks.add(message.process)
        elif isinstance(message, m.InboxState):
            self._backpressure(self.core.inbox_state(message.process, message.stage, message.full))
        elif isinstance(message, m.InputTaken):
            self._input_taken(message)
        elif isinstance(message, m.StatsReply):
            waiter = self._stats_waiters.get(message.seq)
            if waiter is not None:
                done, replies = waiter
                replies[message.process] = message
                live = {p for p in self.launcher.handles if p not in self.down}
                if live <= set(replies) and not done.done():
                    done.set_result(None)

    def _tcp_address(self, process: str, address: str) -> None:
        """A (re)started process's tcp address: the next hello hands it to every peer."""
        self.endpoint.set_tcp_addresses({process: address})
        self.launcher.tcp_ports[process] = int(address.rsplit(":", 1)[1])

    def _terminal_output(self, message: m.TerminalOutput, frames: list[memoryview]) -> None:
        try:
            data = decode(message.payload, self._reader, self.topology.allow_pickle, frames=frames)
        except Exception as exc:  # e.g. an object that pickles but does not unpickle: this request fails
            self._fail(
                message.request_id,
                message.stage,
                f"the output of stage {message.stage!r} could not be decoded: {describe_error(exc)}",
            )
            return
        finally:
            if message.payload.shm is not None:
                self.endpoint.send_to(message.payload.shm.owner, m.SlotRelease(message.payload.shm))
        self._broadcast_all(
            self.core.terminal_output(message.request_id, message.stage, message.seq, message.final, data)
        )

    def _backpressure(self, hold: bool | None) -> None:
        if hold is not None:
            self.on_backpressure(hold)

    # --- faults -----------------------------------------------------------------------

    def on_process_exit(self, instance: str, exit_description: str) -> None:
        """``instance`` (a process, or one replica of it) died: fail the requests pinned to
        it, restart it if the policy allows; the other replicas keep serving."""
        process = self.topology.processes[self.launcher.process_of[instance]]
        self._reader.drop_dead()  # its segments are unlinked: unmap them here, or their memory stays
        if instance in self.core.standby:  # a replica the autoscaler was starting: it held nothing
            handle = self.launcher.handles[instance]
            why = f"replica {instance!r} (stages {', '.join(process.stages)}) died while starting: {exit_description}"
            _fail_launch(handle.ready, LaunchError(process.stages[0], why))
            return  # _scale_up logs it; the replica stays in standby
        death = self.core.process_died(instance, exit_description)
        why, failed = death.why, death.failed
        self._backpressure(death.backpressure)
        handle = self.launcher.handles[instance]
        if not handle.ready.done():
            # A stage that failed to build sends why (LaunchFailed) just before it exits, and
            # its exit can be seen first: give that report a moment to win over "died".
            asyncio.get_running_loop().call_later(
                _LAUNCH_REPORT_GRACE_S, _fail_launch, handle.ready, LaunchError(process.stages[0], why)
            )
        # What was sent to the dead instance and not read is lost with it: drop the socket
        # to it (its queue held only the failed requests' messages, which must not reach the
        # replacement and release reused slots) and take back the slots, here and, after the
        # aborts (the core's broadcasts end with ProcessLost), in every stage process.
        self.endpoint.lost(instance)
        self._broadcast_all(death.broadcasts)
        # Logged once, here: the death, what it cost and what happens next (each request it
        # failed is logged by whoever answers it; each replay here, naming request and stage).
        cost = f"{len(failed)} request(s) pinned to it failed, {len(death.replayed)} replayed"
        if instance in self.core.draining:  # the autoscaler was removing it anyway: not restarted
            log.error("%s while draining; %s; it stays removed", why, cost)
            self.core.replica_removed(instance)
        elif handle.restarts < self.max_restarts:
            log.error("%s; %s; restarting it (restart %d of %d)", why, cost, handle.restarts + 1, self.max_restarts)
            asyncio.get_running_loop().create_task(self._restart(instance, death.dropped))
        else:
            log.error("%s; %s; no restart left (max_restarts %d)", why, cost, self.max_restarts)
            self.core.lose(instance, why)
        for replayed in death.replayed:
            log.warning(
                "request %s: %s from the entry (replay %d of %d): stage %r lost it: %s",
                replayed.request_id,
                "resumed with the tokens its caller has forced" if replayed.resumed else "replayed",
                replayed.attempt,
                self.core.replay_limit,
                replayed.stage,
                why,
            )
        self._broadcast_all(self.core.fail_waiting_replays())
        self._replay()

    async def _restart(self, instance: str, failed: list[str]) -> None:
        handle = self.launcher.start(instance)
        try:
            await asyncio.wait_for(handle.ready, self.ready_timeout)
            await asyncio.wait_for(self._handshake([instance]), self.ready_timeout)
        except (LaunchError, asyncio.TimeoutError) as exc:
            if handle.alive():  # hung rather than exited: no exit will trigger another try
                handle.kill()
            why = self._start_failure(exc)
            log.error("stage process %r could not be restarted: %s", instance, why)
            if handle.restarts >= self.max_restarts:
                self.core.lose(instance, f"stage process {instance!r} could not be restarted: {why}")
                self._broadcast_all(self.core.fail_waiting_replays())
            return  # otherwise its exit starts the next restart
        self._broadcast_all(self.core.process_back(instance, failed))
        log.info("stage process %r is back", instance)
        self._replay()  # the replays that waited for it

    def _start_failure(self, exc: LaunchError | asyncio.TimeoutError) -> str:
        """Why a (re)start failed, for the log: a timeout's own text is empty."""
        if isinstance(exc, asyncio.TimeoutError):
            return f"it did not answer within the ready timeout ({self.ready_timeout:g}s)"
        return str(exc)

    # --- elastic replicas ---------------------------------------------------------------

    async def _autoscale(self) -> None:
        loop = asyncio.get_running_loop()
        windows = [p.elastic.window for p in self.autoscaler.processes if p.elastic is not None]
        tick = max(_AUTOSCALE_MIN_TICK_S, min([_AUTOSCALE_TICK_S, *(w / 4 for w in windows)]))
        placement = self.core.placement
        while True:
            await asyncio.sleep(tick)
            running = {p.name: self.core.running(p.name) for p in self.autoscaler.processes}
            decisions = self.autoscaler.decide(
                loop.time(), placement.in_flight, running, self.core.standby, self._starting, placement.flow
            )
            for decision in decisions:
                self._scale(decision)
            for instance in self.core.drained():
                if instance not in self._retiring:
                    self._retiring.add(instance)
                    loop.create_task(self._remove(instance))

    def _scale(self, decision: ScaleDecision) -> None:
        # Logged once, here: the decision with the figure that triggered it.
        count = len(self.core.running(decision.process))
        maximum = self.topology.processes[decision.process].replicas
        if decision.up:  # counted with those this tick's decisions already start
            count += sum(1 for name in self._starting if self.launcher.process_of[name] == decision.process)
            log.info(
                "scaling process %r up: %s; starting %r (%d -> %d of max %d)",
                decision.process,
                decision.why,
                decision.instance,
                count,
                count + 1,
                maximum,
            )
            self._starting.add(decision.instance)
            asyncio.get_running_loop().create_task(self._scale_up(decision.instance))
        else:
            log.info(
                "scaling process %r down: %r %s; draining it (%d -> %d)",
                decision.process,
                decision.instance,
                decision.why,
                count,
                count - 1,
            )
            self.core.drain(decision.instance)

    async def _scale_up(self, instance: str) -> None:
        try:
            handle = self.launcher.start(instance)
            await asyncio.wait_for(handle.ready, self.ready_timeout)
            await asyncio.wait_for(self._handshake([instance]), self.ready_timeout)
        except (LaunchError, asyncio.TimeoutError) as exc:
            why = self._start_failure(exc)
            log.error("replica %r could not be started (scale up): %s; it stays in standby", instance, why)
            if instance in self.launcher.handles:
                await self.launcher.retire(instance)
            return
        finally:
            self._starting.discard(instance)
        self.core.replica_added(instance)
        broadcasts, moved = self.core.rebalance(instance, self._starting)
        self._broadcast_all(broadcasts)
        if moved:
            log.info("replica %r is up; %d queued request(s) moved to it, re-run from the entry", instance, len(moved))
        else:
            log.info("replica %r is up", instance)
        self._replay()  # the moved requests, and replays waiting for a replica of this process

    async def _remove(self, instance: str) -> None:
        """Stop a drained replica: it holds no request, so nothing is lost."""
        try:
            await self.launcher.retire(instance)
            # Like a death, minus the aborts (it held nothing): every process takes back the
            # slots it lent it and drops its socket to it.
            self.endpoint.lost(instance)
            self._broadcast_all([m.ProcessLost(instance)])
            self.core.replica_removed(instance)
            log.info("replica %r drained and stopped", instance)
        finally:
            self._retiring.discard(instance)

    def scaling(self) -> dict[str, dict[str, int]]:
        """Per elastic process: replicas running now, and the scaling decisions so far."""
        return {
            p.name: {
                "replicas": len(self.core.running(p.name)),
                "scaled_up": self.autoscaler.counts[(p.name, "up")],
                "scaled_down": self.autoscaler.counts[(p.name, "down")],
            }
            for p in self.autoscaler.processes
        }

    # --- introspection ----------------------------------------------------------------

    def held(self) -> dict[str, int]:
        """The core's per-request state, and the shared-memory slots lent for entry inputs."""
        return {**self.core.held(), "slots_in_use": self._pool.in_use}

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Per node label: its OS processes and whether they are up (see node_stats)."""
        return node_stats(self.topology, self.down, self.core.standby)

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """Per stage: status and the state it holds, over its replicas (see stage_stats)."""
        seq = next(self._stats_seq)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        replies: dict[str, m.StatsReply] = {}
        self._stats_waiters[seq] = (done, replies)
        try:
            if set(self.launcher.handles) - set(self.down):
                await self._broadcast.send(m.encode(m.StatsRequest(seq)))
                await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            pass  # report what answered; the rest shows as unknown
        finally:
            del self._stats_waiters[seq]
        return stage_stats(self.topology, replies, self.down, self.core.standby)


def _fail_launch(ready: asyncio.Future[None], error: LaunchError) -> None:
    if not ready.done():
        ready.set_exception(error)
