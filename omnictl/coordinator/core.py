"""The coordinator's logic: every request's state, and what to tell the stages about it.

:class:`CoordinatorCore` is a plain object: it takes what happened (a submit, a stage's
message, a process death, the clock) and returns what must be broadcast to the stages
(aborts, lost processes). It opens no socket and runs no event loop, so every rule here is
unit-tested directly (``tests/coordinator/test_core.py``); :class:`~omnictl.coordinator.
coordinator.Coordinator` is the thin shell that feeds it from the wire and carries out what
it returns, as vLLM splits ``EngineCore`` (what to do) from ``EngineCoreProc`` (its IO).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Collection, Container, Mapping, Sequence, Union

from omnictl import messages as m
from omnictl.coordinator.placement import ReplicaPlacement
from omnictl.coordinator.pruning import active_stages, select_terminals
from omnictl.coordinator.request import InputStream, RequestEvent, RequestEventKind, RequestRecord, RequestState
from omnictl.exceptions import InvalidRequest, PipelineDead, RequestAborted, RequestFailed
from omnictl.outputs import AudioChunk, TokenDelta
from omnictl.profiling.events import EventKind, MetaValue, NullProfiler, Profiler
from omnictl.recent import RecentIds
from omnictl.topology.model import Topology

# A reused request id is refused for as long as it is remembered; a client may reuse one long
# after it finished, so the coordinator remembers more than a stage (DEFAULT_RECENT_IDS): ~17 MB for uuid-hex ids.
RECENT_IDS = 100_000

# What the core asks the shell to broadcast to every stage process (PUB/SUB).
Broadcast = Union[m.Abort, m.ProcessLost]


@dataclass(frozen=True)
class Admitted:
    """A request the core has checked and placed: the shell encodes its inputs, sends
    ``Submit(context, entry, payload)`` to ``instance`` and calls
    :meth:`CoordinatorCore.commit`, or :meth:`CoordinatorCore.withdraw` when the inputs
    cannot be encoded."""

    record: RequestRecord
    context: m.RequestContext
    entry: str
    instance: str  # the OS process (replica) of the entry stage
    terminals: tuple[str, ...]  # the terminals it expects, in the topology's order
    trace_parent: dict[str, MetaValue]


@dataclass(frozen=True)
class Replayed:
    """A request a death sends back to the entry: its id, the stage of the dead process it
    was using, and which replay this is (1 for the first)."""

    request_id: str
    stage: str
    attempt: int
    resumed: bool = False  # its caller had streamed text: it resumes with those tokens forced


@dataclass(frozen=True)
class ProcessDeath:
    """What a dead process cost: why (one sentence naming it), the requests pinned to it
    that failed and those queued for a replay (each in submit order), the ids the stages
    knew them by (a restarted process must drop those), and what to broadcast."""

    why: str
    failed: list[str]
    broadcasts: list[Broadcast]
    backpressure: bool | None  # as inbox_state: admission's new hold, if its queue's death changed it
    replayed: list[Replayed] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


class CoordinatorCore:
    """Request state: records, replica placement, terminals still expected, which processes
    are down or lost, which stage inboxes are full. Holds nothing for a finished request
    but its id (so it cannot be reused)."""

    def __init__(
        self,
        topology: Topology,
        *,
        request_timeout: float = 300.0,
        profiler: Profiler | None = None,
        recent_ids: int = RECENT_IDS,
        replay_limit: int = 1,
    ) -> None:
        """``replay_limit``: how often a request that had sent its caller nothing yet is re-run
        from the entry after a process it was pinned to died (0: it fails at once)."""
        if replay_limit < 0:
            raise ValueError(f"replay_limit must be >= 0, not {replay_limit!r}")
        self.topology = topology
        self.replay_limit = replay_limit
        self.request_timeout = request_timeout
        self.profiler = profiler or NullProfiler()
        self.requests: dict[str, RequestRecord] = {}
        self.recent = RecentIds(recent_ids)  # finished ids, refused if reused
        self.placement = ReplicaPlacement(topology)
        self.down: dict[str, str] = {}  # OS process (replica) -> why it is down
        # Replicas up but not answering stats (frozen, loop stuck: the server's liveness
        # check sets this): new requests are pinned to the other replicas, as if down.
        self.unresponsive: frozenset[str] = frozenset()
        self.lost: set[str] = set()  # replicas down for good (no restart left)
        # Elastic processes (`replicas: {min, max}`): replicas not running (never started, or
        # removed by the autoscaler), and those draining (no new request; removed once empty).
        self.standby: set[str] = {n for p in topology.processes.values() for n in p.instances[p.initial :]}
        self.draining: set[str] = set()
        self.replayed = 0  # requests re-run from the entry (each replay counts)
        self.resumed = 0  # of those, streams resumed with the tokens their caller had forced
        self.dead_reason: str | None = None
        # Backpressure: (OS process, stage) whose inbox is full; admission holds while any is.
        self.full_inboxes: set[tuple[str, str]] = set()
        self._active: dict[tuple[str, ...], tuple[str, ...]] = {}  # terminals -> stages that run
        self.process_of = {name: p.name for p in topology.processes.values() for name in p.instances}
        # Replays: the wire id of each replayed attempt -> its request id; the requests
        # waiting for a replica to re-run on (in arrival order), each with the stage it lost.
        self._wire: dict[str, str] = {}
        self._replays: dict[str, str] = {}
        # requests a new replica took from the others' backlog -> (process, that replica)
        self._targets: dict[str, tuple[str, str]] = {}

    # --- health -----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Every replica of every process is up."""
        return not self.down and self.dead_reason is None

    def health(self) -> tuple[str, dict[str, str]]:
        """``ok``; ``degraded`` while every process has a replica up but some replica is
        down; ``down`` when some process has none (or the pipeline is dead). With the
        down replicas and why."""
        if self.dead_reason is not None or any(
            all(name in self.down or name in self.standby for name in p.instances)
            for p in self.topology.processes.values()
        ):
            return "down", dict(self.down)
        return ("degraded" if self.down else "ok"), dict(self.down)

    # --- requests ---------------------------------------------------------------------

    def admit(
        self,
        now: float,
        modalities: Sequence[str] | None = None,
        request_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        trace_parent: Mapping[str, MetaValue] | None = None,
    ) -> Admitted:
        """Check and place a new request (``now``: loop time, for its deadline); see
        :class:`Admitted`. Raises :class:`PipelineDead` or :class:`InvalidRequest`, leaving
        no trace."""
        if self.dead_reason is not None:
            raise PipelineDead(self.dead_reason)
        terminals = select_terminals(self.topology, modalities)
        active = self._active.get(terminals)
        if active is None:  # one graph walk per selection of terminals, not per request
            active = self._active[terminals] = active_stages(self.topology, terminals)
        rid = request_id or uuid.uuid4().hex
        if rid in self.requests or rid in self.recent or rid in self._wire:
            # Stages drop late messages of finished ids, so a reused id would never complete.
            raise InvalidRequest(f"request id {rid!r} was already used; ids must be unique", field="request_id")
        context_params = {**(params or {}), "modalities": sorted({self.topology.terminals[t] for t in terminals})}
        try:
            replicas = self.placement.assign(rid, active, self._unavailable())
        except PipelineDead as exc:
            raise PipelineDead(f"{exc}: {'; '.join(self.down.values())}") from exc
        entry = self.topology.entry
        process = self.topology.processes[self.topology.process_of(entry)]
        instance = process.instances[replicas.get(process.name, 0)]
        record = RequestRecord(rid, set(terminals), active, now + self.request_timeout, params=context_params)
        return Admitted(
            record,
            m.RequestContext(rid, context_params, active, replicas),
            entry,
            instance,
            terminals,
            dict(trace_parent or {}),
        )

    def commit(self, admitted: Admitted, inputs: Any = None, stream: bool = True, input_stream: bool = False) -> None:
        """The admitted request's submit is on its way: it is running from now on. Its
        ``inputs`` are held for a replay (see :meth:`process_died`) until its caller sees
        output: its first stream chunk or result, or (``stream`` False: the caller reads
        only the results, all at the end) its completion. ``input_stream``: its input
        arrives over time instead (:meth:`next_chunk`, :meth:`end_input`, the first chunk
        too); ``inputs`` is then the list of chunks sent so far, held on the same terms
        (none when replays are off)."""
        record = admitted.record
        record.caller_streams = stream
        if input_stream:
            record.input_stream = InputStream(admitted.context, admitted.entry, admitted.instance)
            inputs = [] if self.replay_limit else None
        record.inputs = inputs  # also what moves a queued request to a replica the autoscaler added
        self.requests[record.request_id] = record
        self.profiler.record(
            EventKind.ADMITTED, record.request_id, None, terminals=",".join(admitted.terminals), **admitted.trace_parent
        )
        record.state = RequestState.RUNNING

    def next_chunk(self, record: RequestRecord, data: Any) -> tuple[InputStream, int] | None:
        """The caller sends ``data``, the next chunk of ``record``'s streamed input: where it
        goes and its seq, or None while the request waits for a replay (it is sent then,
        with those before it). The shell encodes and sends the chunk itself; it is held here
        only while a replay could need it (see :meth:`commit`)."""
        stream = self._open_input(record)
        seq = stream.sent
        stream.sent += 1
        if record.inputs is not None:
            record.inputs.append(data)
        return (stream, seq) if record.wire_id else None

    def end_input(self, record: RequestRecord) -> InputStream | None:
        """The caller ended ``record``'s streamed input: where the stream's end goes (None
        while it waits for a replay, which sends the end after the chunks)."""
        stream = self._open_input(record)
        stream.ended = True
        return stream if record.wire_id else None

    def input_taken(self, wire_id: str, taken: int) -> RequestRecord | None:
        """The entry's scheduler has taken ``taken`` chunks of the attempt ``wire_id``'s
        streamed input: the record whose caller may send more, or None (an attempt no longer
        running, a late report)."""
        record = self._attempt(wire_id)
        if record is None or record.input_stream is None:
            return None
        record.input_stream.taken = max(record.input_stream.taken, taken)
        return record

    def _open_input(self, record: RequestRecord) -> InputStream:
        """``record``'s input stream, still open (the handle checked it before it called the
        shell; a request that ended meanwhile, on this loop, is refused the same way)."""
        stream = record.input_stream
        if stream is None or stream.ended or record.finished:
            state = "takes no streamed input" if stream is None else "has ended" if record.finished else "ended"
            raise InvalidRequest(f"request {record.request_id} {state}: no more input is taken", field="input")
        return stream

    def withdraw(self, admitted: Admitted) -> None:
        """An admitted request whose inputs could not be encoded: forget it entirely (no
        stage has heard of it, and its id may be used again)."""
        self.placement.release(admitted.record.request_id)

    def abort(self, request_id: str) -> list[Broadcast]:
        record = self.requests.get(request_id)
        if record is None:
            return []
        return self._finish(
            record, RequestState.ABORTED, RequestAborted(request_id, f"request {request_id} was aborted")
        )

    def shutdown(self) -> list[Broadcast]:
        """The pipeline is closing: every request still running is aborted."""
        broadcasts: list[Broadcast] = []
        for record in list(self.requests.values()):
            broadcasts += self._finish(
                record, RequestState.ABORTED, RequestAborted(record.request_id, "the pipeline shut down")
            )
        return broadcasts

    def fail(
        self, request_id: str, stage: str | None, message: str, rejected: bool = False, field: str | None = None
    ) -> list[Broadcast]:
        """``request_id`` (the id the stages know: see :attr:`RequestRecord.wire_id`) failed
        (a stage said so, or the coordinator found out); a finished, unknown or superseded
        id (an attempt that was replayed) is ignored."""
        record = self._attempt(request_id)
        if record is None:
            return []
        return self._fail(record, stage, message, rejected, field)

    def _fail(
        self, record: RequestRecord, stage: str | None, message: str, rejected: bool = False, field: str | None = None
    ) -> list[Broadcast]:
        error = RequestFailed(record.request_id, message, stage, field)
        return self._finish(record, RequestState.FAILED, error, rejected)

    def _attempt(self, wire_id: str) -> RequestRecord | None:
        """The running request whose current attempt the stages know as ``wire_id``."""
        record = self.requests.get(self._wire.get(wire_id, wire_id))
        return record if record is not None and record.wire_id == wire_id else None

    def expire(self, now: float) -> list[Broadcast]:
        """Fail every request whose deadline has passed at loop time ``now``."""
        broadcasts: list[Broadcast] = []
        for record in [r for r in self.requests.values() if r.deadline <= now]:
            stream = record.input_stream
            waiting = (
                f"its input was never ended ({stream.sent} chunk(s) received)"
                if stream is not None and not stream.ended
                else f"terminals still expected: {sorted(record.expected)}"
            )
            broadcasts += self._fail(
                record, None, f"request {record.request_id} missed its deadline of {self.request_timeout:g}s; {waiting}"
            )
        return broadcasts

    def _finish(
        self,
        record: RequestRecord,
        state: RequestState,
        error: RequestFailed | RequestAborted | None = None,
        rejected: bool = False,
    ) -> list[Broadcast]:
        if record.finished:
            return []
        self.requests.pop(record.request_id, None)
        self.placement.release(record.request_id)
        self.recent.add(record.request_id)
        self._replays.pop(record.request_id, None)
        self._targets.pop(record.request_id, None)
        running = bool(record.wire_id)  # a replay waiting for a replica has no attempt running
        if running and record.wire_id != record.request_id:
            del self._wire[record.wire_id]
            self.recent.add(record.wire_id)  # a client may not take it for a request of its own
        broadcasts: list[Broadcast] = []
        if state is RequestState.COMPLETED:
            self.profiler.record(EventKind.COMPLETED, record.request_id, None)
        else:
            if running:  # every stage drops what it holds for this request, at once
                broadcasts.append(m.Abort((record.wire_id,)))
            kind = EventKind.ABORTED if state is RequestState.ABORTED else EventKind.FAILED
            # `rejected`: the stage refused the input; the dashboard counts it apart from failures
            meta: dict[str, MetaValue] = {"error": str(error), "rejected": True} if rejected else {"error": str(error)}
            self.profiler.record(kind, record.request_id, error.stage if error else None, **meta)
        record.finish(state, error)
        return broadcasts

    # --- what the stages report -------------------------------------------------------

    def stage_message(self, message: m.StageFailed | m.TerminalSkipped) -> list[Broadcast]:
        if isinstance(message, m.StageFailed):
            return self.fail(message.request_id, message.stage, message.error, message.rejected, message.field)
        record = self._attempt(message.request_id)
        if record is None:
            return []
        record.expected.discard(message.stage)
        return self._maybe_complete(record)

    def terminal_output(self, request_id: str, stage: str, seq: int, final: bool, data: Any) -> list[Broadcast]:
        """A terminal stage's stream chunk (``final`` false) or result, decoded."""
        record = self._attempt(request_id)
        if record is None:
            return []  # finished (aborted, failed) or replayed while this was in flight
        request_id = record.request_id
        if record.caller_streams:  # from now on the caller has seen output: a replay would show it twice
            record.output_sent = True
            if not final and isinstance(data, TokenDelta) and record.sent_tokens is not None:
                # an autoregressive stream: resumable with these tokens forced (inputs kept)
                record.sent_tokens.setdefault(stage, []).extend(int(t) for t in data.token_ids)
            else:
                record.sent_tokens, record.inputs = None, None
        if stage not in record.first_marked and _carries_output(data):
            # The terminal's first output that holds something: a talker that ends on its first
            # step makes a vocoder return no samples, and its client has heard nothing yet.
            record.first_marked.add(stage)
            modality = self.topology.terminals[stage]
            if modality == "text":
                self.profiler.record(EventKind.FIRST_TEXT, request_id, stage)
            elif modality == "audio":
                self.profiler.record(EventKind.FIRST_AUDIO, request_id, stage)
        if not final:
            record.events.put_nowait(RequestEvent(RequestEventKind.STREAM, stage, data))
            return []
        record.results[stage] = data
        record.expected.discard(stage)
        record.events.put_nowait(RequestEvent(RequestEventKind.RESULT, stage, data))
        self.profiler.record(EventKind.TERMINAL_COMPLETE, request_id, stage)
        return self._maybe_complete(record)

    def _maybe_complete(self, record: RequestRecord) -> list[Broadcast]:
        if record.expected:
            return []
        if record.results:
            return self._finish(record, RequestState.COMPLETED)
        return self._fail(record, None, "no terminal produced a result: every branch was skipped")

    def inbox_state(self, process: str, stage: str, full: bool) -> bool | None:
        """A stage inbox filled up or drained. Returns whether admission must now hold
        (True) or may resume (False) when that changed, else None."""
        was = bool(self.full_inboxes)
        if full:
            self.full_inboxes.add((process, stage))
        else:
            self.full_inboxes.discard((process, stage))
        now = bool(self.full_inboxes)
        return now if now != was else None

    # --- faults -----------------------------------------------------------------------

    def process_died(self, instance: str, exit_description: str) -> ProcessDeath:
        """``instance`` (a process, or one replica of it) died: it is down, and every stage
        process must drop what it holds from it. Each request pinned to it that has sent its
        caller nothing yet, and was replayed fewer than ``replay_limit`` times, is queued to
        re-run from the entry (:meth:`take_replays`); the others fail, naming the first of
        its stages each was using. Whether it restarts is the shell's call."""
        process = self.topology.processes[self.process_of[instance]]
        label = f"replica {instance!r}" if process.replicas > 1 else f"stage process {instance!r}"
        where = f", node {process.node!r}" if process.node is not None else ""
        why = f"{label} (stages {', '.join(process.stages)}{where}) died: {exit_description}"
        self.down[instance] = why
        was_full = bool(self.full_inboxes)
        self.full_inboxes = {key for key in self.full_inboxes if key[0] != instance}  # its queues died with it
        backpressure = False if was_full and not self.full_inboxes else None
        failed: list[str] = []
        replayed: list[Replayed] = []
        dropped: list[str] = []
        broadcasts: list[Broadcast] = []
        for request_id in self.placement.holders(instance):
            record = self.requests.get(request_id)
            if record is None:
                continue
            stage = next((s for s in process.stages if s in record.active), process.stages[0])
            dropped.append(record.wire_id)
            resumable = bool(record.sent_tokens) and record.inputs is not None
            if (record.output_sent and not resumable) or record.replays >= self.replay_limit:
                failed.append(request_id)
                if record.output_sent and not resumable and self.replay_limit:
                    reason = "not replayed: its caller already received output it cannot resume from"
                elif record.replays:
                    reason = f"replayed {record.replays} time(s) already, the replay limit"
                else:
                    reason = ""
                broadcasts += self._fail(
                    record, stage, f"stage {stage!r} failed: {why}" + (f" ({reason})" if reason else "")
                )
                continue
            # Replayed: every stage drops the attempt it knew, and the request waits for a
            # replica (it keeps its deadline, and an abort still ends it).
            broadcasts += self._requeue(record, stage)
            record.replays += 1
            self.replayed += 1
            if record.output_sent:  # its autoregressive stream resumes where the caller stopped
                record.resumes += 1
                self.resumed += 1
            replayed.append(Replayed(request_id, stage, record.replays, record.output_sent))
        # After the aborts: every process takes back the slots it lent the dead one.
        broadcasts.append(m.ProcessLost(instance))
        return ProcessDeath(why, failed, broadcasts, backpressure, replayed, dropped)

    def _requeue(self, record: RequestRecord, stage: str) -> list[Broadcast]:
        """End the running attempt of ``record`` everywhere and queue it to re-run from the
        entry (:meth:`take_replays`)."""
        broadcasts: list[Broadcast] = [m.Abort((record.wire_id,))]
        self.placement.release(record.request_id)
        self._retire_attempt(record)
        # a terminal may have been skipped (that is no output): the replay expects them all again
        record.expected = {t for t in self.topology.terminals if t in record.active}
        record.results.clear()  # a caller that reads only results: none from the lost attempt
        self._replays[record.request_id] = stage
        return broadcasts

    def rebalance(self, instance: str, starting: Collection[str] = ()) -> tuple[list[Broadcast], list[str]]:
        """``instance`` was just added to its process: requests are pinned at submit, so the
        backlog queued on the other replicas would stay there. It takes its even share of
        what the process holds, counted over the replicas running and those of ``starting``
        still coming up (each takes its own share when it answers: a request is never moved
        twice between replicas that answer a few ms apart): the newest requests, which a
        replica serving in arrival order has not started, from the replicas holding most
        beyond that share, among those that have shown their caller nothing and have not
        been re-run already. Each is re-run from the entry (:meth:`take_replays`, arrival
        order) on ``instance``; its old attempt is retired, so it cannot reach the caller even
        if it runs. Not counted as replays. Returns the broadcasts and the ids moved."""
        process = self.topology.processes[self.process_of[instance]]
        live = self.running(process.name)
        coming = [n for n in starting if n != instance and n not in live and self.process_of.get(n) == process.name]
        in_flight = self.placement.in_flight
        share = -(-sum(in_flight[name] for name in live) // (len(live) + len(coming)))  # ceil
        excess = {name: in_flight[name] - share for name in live if name != instance and in_flight[name] > share}
        movable: dict[str, list[str]] = {}
        for name in excess:  # newest first: queued last
            movable[name] = [
                rid
                for rid in reversed(self.placement.holders(name))
                if (record := self.requests.get(rid)) is not None
                and not record.output_sent
                and record.inputs is not None
                and record.wire_id == rid  # its first attempt: neither replayed nor moved before
            ]
        moved: set[str] = set()
        wanted = min(share, sum(excess.values()))
        while len(moved) < wanted:
            donors = [name for name in excess if excess[name] > 0 and movable[name]]
            if not donors:
                break
            donor = max(donors, key=lambda n: excess[n])
            moved.add(movable[donor].pop(0))
            excess[donor] -= 1
        broadcasts: list[Broadcast] = []
        order = [rid for rid in self.requests if rid in moved]  # arrival order
        stage = process.stages[0]
        for request_id in order:
            broadcasts += self._requeue(self.requests[request_id], stage)
            self._targets[request_id] = (process.name, instance)
        return broadcasts, order

    def _retire_attempt(self, record: RequestRecord) -> None:
        """The stages' id for this attempt is finished: late messages carrying it are dropped."""
        if record.wire_id != record.request_id:
            del self._wire[record.wire_id]
        self.recent.add(record.wire_id)
        record.wire_id = ""  # no attempt runs until take_replays places one

    def take_replays(self) -> list[Admitted]:
        """Place every queued replay that has a replica up, in arrival order (the shell sends
        them before any new request, as ``Submit`` with the :class:`Admitted`'s context and
        the record's held inputs). Those with no replica up stay queued (for
        :meth:`process_back`)."""
        placed: list[Admitted] = []
        for request_id in list(self._replays):
            record = self.requests[request_id]
            target = self._targets.pop(request_id, None)
            try:
                prefer = dict([target]) if target is not None else None
                replicas = self.placement.assign(request_id, record.active, self._unavailable(), prefer)
            except PipelineDead:
                continue
            del self._replays[request_id]
            record.wire_id = self._fresh_wire_id(record)
            self._wire[record.wire_id] = request_id
            entry = self.topology.entry
            process = self.topology.processes[self.topology.process_of(entry)]
            instance = process.instances[replicas.get(process.name, 0)]
            params = record.params
            if record.output_sent and record.sent_tokens:  # a resume: the tokens the caller has, forced
                params = {**params, m.RESUME_PARAM: {s: list(t) for s, t in record.sent_tokens.items()}}
            context = m.RequestContext(record.wire_id, params, record.active, replicas)
            terminals = tuple(t for t in self.topology.terminals if t in record.expected)
            if record.input_stream is not None:  # its next chunks go to the new attempt
                record.input_stream.context, record.input_stream.instance = context, instance
                record.input_stream.taken = 0  # which takes every chunk again
            placed.append(Admitted(record, context, entry, instance, terminals, {}))
        return placed

    def _fresh_wire_id(self, record: RequestRecord) -> str:
        attempt = record.replays
        while True:
            wire_id = f"{record.request_id}~{attempt}"
            if wire_id not in self.requests and wire_id not in self.recent and wire_id not in self._wire:
                return wire_id
            attempt += 1

    def replay_failed(self, admitted: Admitted, why: str) -> list[Broadcast]:
        """A placed replay could not be sent (its inputs no longer encode): it fails, naming
        the stage it lost."""
        return self._fail(
            admitted.record, admitted.entry, f"request {admitted.record.request_id} could not be replayed: {why}"
        )

    def process_back(self, instance: str, failed: Sequence[str]) -> list[Broadcast]:
        """``instance`` restarted and answered. The new process never heard the aborts for
        what its predecessor held (``failed``: the ids the stages knew them by): data for
        those requests still in flight must not build state there. Replays waiting for it
        are placed by the next :meth:`take_replays`."""
        self.down.pop(instance, None)
        return [m.Abort(tuple(failed))] if failed else []

    def lose(self, instance: str, why: str) -> None:
        """No restart left for ``instance``: the pipeline is dead once a process has lost
        every replica."""
        self.lost.add(instance)
        if self._gone(self.process_of[instance]):
            self.dead_reason = why

    def fail_waiting_replays(self) -> list[Broadcast]:
        """Fail the queued replays that can no longer be placed (some process they need has
        no replica up and none coming back), naming the stage each lost."""
        broadcasts: list[Broadcast] = []
        for request_id, stage in list(self._replays.items()):
            record = self.requests[request_id]
            processes = {self.topology.process_of(s) for s in record.active}
            hopeless = self.dead_reason is not None or any(self._gone(p) for p in processes)
            if hopeless:
                why = self.dead_reason or "; ".join(self.down[n] for n in self.lost if n in self.down)
                broadcasts += self._fail(
                    record, stage, f"stage {stage!r} failed: {why} (no replica left to replay it on)"
                )
        return broadcasts

    # --- elastic replicas ---------------------------------------------------------------

    def _unavailable(self) -> _Either:
        """The replicas no new request (or replay) may be pinned to."""
        return _Either(self.down, self.unresponsive, self.standby, self.draining)

    def running(self, process: str) -> list[str]:
        """The replicas of ``process`` that take new requests, in replica order."""
        unavailable = self._unavailable()
        return [name for name in self.topology.processes[process].instances if name not in unavailable]

    def replica_added(self, instance: str) -> None:
        """A standby replica was started and answered: it takes requests from now on."""
        self.standby.discard(instance)
        self.down.pop(instance, None)

    def drain(self, instance: str) -> None:
        """``instance`` takes no new request; :meth:`drained` says when its last one ended."""
        self.draining.add(instance)

    def drained(self) -> list[str]:
        """The draining replicas that hold no request any more: ready to be stopped."""
        return [name for name in sorted(self.draining) if self.placement.in_flight[name] == 0]

    def replica_removed(self, instance: str) -> None:
        """A drained replica was stopped (or died while draining): it is standby again."""
        self.draining.discard(instance)
        self.standby.add(instance)
        self.down.pop(instance, None)

    def _gone(self, process: str) -> bool:
        """Every replica of ``process`` is lost for good (standby ones do not count)."""
        instances = [n for n in self.topology.processes[process].instances if n not in self.standby]
        return all(name in self.lost for name in instances)

    # --- introspection ----------------------------------------------------------------

    def held(self) -> dict[str, int]:
        """How much per-request state the core holds (0 everywhere once every request has
        ended): records, requests placed on a replica, and the in-flight counts."""
        return {
            "requests": len(self.requests),
            "placed": self.placement.placed(),
            "replica_in_flight": sum(self.placement.in_flight.values()),
            "replays_waiting": len(self._replays),
        }


class _Either:
    """``name in _Either(a, b, ...)``: in any of the containers (without building their union
    per request)."""

    __slots__ = ("containers",)

    def __init__(self, *containers: Container[str]) -> None:
        self.containers = containers

    def __contains__(self, name: object) -> bool:
        return any(name in container for container in self.containers)


def _carries_output(data: Any) -> bool:
    """Whether a terminal's chunk or result holds something its client can hear: audio of no
    samples does not (a clause of "..." or a talker that stopped at once); anything else does."""
    if isinstance(data, AudioChunk):
        return data.samples.size > 0
    return True
