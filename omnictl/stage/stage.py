"""The Stage: an IO shell around a scheduler. It computes nothing.

UNPACK happens in the process's receive loop (``omnictl.stage.worker``); here are
FAN-IN, ROUTE and STREAM, plus abort. The Stage talks to the model side only through
``scheduler.inbox`` / ``scheduler.deliver`` and never asks what kind of scheduler it is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Protocol

from omnictl.exceptions import describe_error
from omnictl.messages import INPUT_SOURCE, RequestContext, StageStats
from omnictl.outputs import check_output
from omnictl.profiling.events import EventKind, Profiler
from omnictl.recent import RecentIds
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler
from omnictl.stage import tp_group
from omnictl.stage.fanin import FanIn, FanInResult
from omnictl.stage.router import RouteContractError, Router
from omnictl.topology.model import StageSpec

log = logging.getLogger(__name__)


class Ports(Protocol):
    """Where a stage's outputs go; implemented by the worker per derived transport."""

    def send_data(self, ctx: RequestContext, src: str, dst: str, data: Any) -> None: ...
    def send_stream(self, ctx: RequestContext, src: str, dst: str, seq: int, data: Any) -> None: ...
    def send_stream_done(self, ctx: RequestContext, src: str, dst: str) -> None: ...
    def send_skip(self, ctx: RequestContext, src: str, dst: str) -> None: ...
    def send_terminal(self, request_id: str, stage: str, final: bool, seq: int, data: Any) -> None: ...
    def send_terminal_skipped(self, request_id: str, stage: str) -> None: ...
    def send_failure(
        self, request_id: str, stage: str, error: str, rejected: bool = False, field: str | None = None
    ) -> None: ...


class Stage:
    def __init__(
        self,
        spec: StageSpec,
        scheduler: Scheduler,
        fanin: FanIn,
        router: Router,
        ports: Ports,
        profiler: Profiler,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.scheduler = scheduler
        self.fanin = fanin
        self.router = router
        self.ports = ports
        self.profiler = profiler
        self._contexts: dict[str, RequestContext] = {}  # requests this stage holds state for
        self._stream_seq: dict[str, int] = {}
        self._streaming_in: set[str] = set()  # receiving chunks from an upstream
        self._finished = RecentIds()  # finished or aborted here: late messages for them are dropped
        # Backpressure: told when the inbox fills (on an arrival) or has room again (on an
        # output, or the worker's poll); the worker tells the coordinator (InboxState).
        self.on_inbox: Callable[[str, bool], None] | None = None
        self._full = False
        # Streamed input (a caller's chunks): how many of each request's its scheduler has
        # taken, told to `on_input_taken` (the worker tells the coordinator: InputTaken) once per
        # loop turn per request, the caller's credit to send more.
        self.on_input_taken: Callable[[str, str, int], None] | None = None
        self._input_taken: dict[str, int] = {}
        self._input_untold: set[str] = set()
        scheduler.inbox.on_take = self._took
        scheduler.profiler = profiler
        scheduler.stage_name = spec.name

    async def start(self) -> None:
        self.scheduler.deliver = self._on_output
        await self.scheduler.start()

    async def stop(self) -> None:
        self.scheduler.deliver = None
        await self.scheduler.stop()
        group = tp_group.running(self.name)
        if group is not None:
            group.stop()  # the followers exit with this process anyway; this is sooner

    # --- inputs -----------------------------------------------------------------------

    def _admit(self, ctx: RequestContext) -> bool:
        """False for a request this stage already finished or saw aborted."""
        if ctx.request_id in self._finished:
            return False
        self._contexts.setdefault(ctx.request_id, ctx)
        return True

    def on_input(self, ctx: RequestContext, source: str | None, data: Any) -> None:
        if not self._admit(ctx):
            return
        self.profiler.record(EventKind.INPUT_RECEIVED, ctx.request_id, self.name, source=source)
        self._fan_in(ctx, source, lambda: self.fanin.arrive(ctx.request_id, ctx.active, source, data))

    def on_skip(self, ctx: RequestContext, source: str) -> None:
        if self._admit(ctx):
            self._fan_in(ctx, source, lambda: self.fanin.skip(ctx.request_id, ctx.active, source))

    def _fan_in(self, ctx: RequestContext, source: str | None, step: Callable[[], FanInResult]) -> None:
        """Apply one arrival (or skip) and act on the outcome: run, keep waiting, or skip."""
        rid = ctx.request_id
        waiting = self.fanin.waiting(rid)
        try:
            outcome = step()
        except Exception as exc:  # merge_fn failed: this request only
            self._fail(rid, f"merge_fn of stage {self.name!r} raised {describe_error(exc)}", exc=exc)
            return
        if waiting and not self.fanin.waiting(rid):
            self.profiler.record(EventKind.FANIN_WAIT_END, rid, self.name)
        if outcome.ready:
            self._enqueue(IncomingMessage(IncomingKind.NEW_REQUEST, rid, outcome.data, source, ctx.params))
        elif outcome.skipped:
            self._skip_downstream(ctx)
        elif not waiting:
            self.profiler.record(EventKind.FANIN_WAIT_START, rid, self.name)

    def on_stream_chunk(self, ctx: RequestContext, source: str, seq: int, data: Any) -> None:
        if not self._admit(ctx):
            return
        self._streaming_in.add(ctx.request_id)
        self.profiler.record(EventKind.STREAM_RECEIVED, ctx.request_id, self.name, source=source, seq=seq)
        self._enqueue(IncomingMessage(IncomingKind.STREAM_CHUNK, ctx.request_id, data, source, ctx.params))

    def on_stream_done(self, ctx: RequestContext, source: str) -> None:
        if not self._admit(ctx):
            return
        self._streaming_in.discard(ctx.request_id)
        self._enqueue(IncomingMessage(IncomingKind.STREAM_DONE, ctx.request_id, None, source, ctx.params))

    def on_abort(self, request_id: str) -> None:
        if request_id in self._contexts or self.fanin.waiting(request_id):
            self.profiler.record(EventKind.STAGE_ABORTED, request_id, self.name)
        self._abort_in_scheduler(request_id)
        self._forget(request_id)
        if self._full:  # its queued messages left the inbox
            self.check_inbox()

    def _abort_in_scheduler(self, request_id: str) -> None:
        """Take the request's messages still waiting in the inbox back out (the scheduler
        would otherwise build state from them after its abort), then abort it there."""
        inbox = self.scheduler.inbox
        inbox.on_take = None  # put back, not taken by the scheduler
        try:
            keep = [inbox.get_nowait() for _ in range(inbox.qsize())]
        finally:
            inbox.on_take = self._took
        for message in keep:
            if message.request_id != request_id:
                inbox.put_nowait(message)
        self.scheduler.abort(request_id)

    def _enqueue(self, message: IncomingMessage) -> None:
        if message.kind is IncomingKind.NEW_REQUEST:
            self.profiler.record(EventKind.QUEUE_ENTER, message.request_id, self.name)
        if self.scheduler.offer(message):
            self._took(message)
            return
        self.scheduler.inbox.put_nowait(message)
        if not self._full:
            self.check_inbox()

    # --- outputs ----------------------------------------------------------------------

    def _on_output(self, message: OutgoingMessage) -> None:
        """One output of the scheduler, on the loop."""
        ctx = self._contexts.get(message.request_id)
        if ctx is not None:  # None: aborted while the scheduler was finishing it
            self._send_out(ctx, message)
        if self._full:  # an output: the scheduler has likely taken from the inbox
            self.check_inbox()

    def _send_out(self, ctx: RequestContext, message: OutgoingMessage) -> None:
        try:
            if message.kind is OutgoingKind.STREAM:
                self._stream(ctx, message)
            elif message.kind is OutgoingKind.RESULT:
                self._route(ctx, message.data)
            else:
                self._fail(ctx.request_id, f"stage {self.name!r} failed: {message.error}", message.field, message.exc)
        except Exception as exc:  # e.g. an output leaf that cannot be serialized: this request fails
            self._fail(ctx.request_id, f"stage {self.name!r} could not send its output: {describe_error(exc)}", exc=exc)

    def _breaks_contract(self, ctx: RequestContext, final: bool, data: Any) -> bool:
        """A terminal's output that is not what its modality promises fails the request here,
        naming this stage, instead of surfacing as a KeyError in whoever reads it."""
        problem = check_output(self.spec.modality or self.name, final, data) if self.spec.terminal else None
        if problem is not None:
            self._fail(ctx.request_id, f"stage {self.name!r} broke the output contract: {problem}")
        return problem is not None

    def _stream(self, ctx: RequestContext, message: OutgoingMessage) -> None:
        if self._breaks_contract(ctx, False, message.data):
            return
        seq = self._stream_seq.get(ctx.request_id, 0)
        self._stream_seq[ctx.request_id] = seq + 1
        if seq == 0:
            self.profiler.record(EventKind.FIRST_EMIT, ctx.request_id, self.name)
        for target in self.spec.stream_to:
            if target in ctx.active:
                self.ports.send_stream(ctx, self.name, target, seq, message.data)
        if self.spec.terminal:
            self.ports.send_terminal(ctx.request_id, self.name, False, seq, message.data)

    def _route(self, ctx: RequestContext, data: Any) -> None:
        rid = ctx.request_id
        if self._breaks_contract(ctx, True, data):
            return
        self.profiler.record(EventKind.STAGE_DONE, rid, self.name)
        for target in self.spec.stream_to:
            if target in ctx.active:
                self.ports.send_stream_done(ctx, self.name, target)
        if self.spec.terminal:
            self.ports.send_terminal(rid, self.name, True, self._stream_seq.get(rid, 0), data)
            self._forget(rid)
            return
        try:
            targets, left_out = self.router.targets(data, ctx.active)
            payloads = [(t, self.router.payload_for(t, data, fan_out=len(targets) > 1)) for t in targets]
        except RouteContractError as exc:
            self._fail(rid, str(exc))
            return
        except Exception as exc:  # a route_fn or projection raised: this request fails
            self._fail(rid, f"routing in stage {self.name!r} raised {describe_error(exc)}", exc=exc)
            return
        for target in left_out:
            self.ports.send_skip(ctx, self.name, target)
        for target, payload in payloads:
            self.ports.send_data(ctx, self.name, target, payload)
        self._forget(rid)

    def _skip_downstream(self, ctx: RequestContext) -> None:
        """No upstream runs for this request: neither does this stage."""
        self._abort_in_scheduler(ctx.request_id)  # it may hold stream state from a stream_to upstream
        if self.spec.terminal:
            self.ports.send_terminal_skipped(ctx.request_id, self.name)
        for target in self.spec.next:
            if target in ctx.active:
                self.ports.send_skip(ctx, self.name, target)
        self._forget(ctx.request_id)

    def _fail(self, request_id: str, error: str, field: str | None = None, exc: BaseException | None = None) -> None:
        # Logged once, here, in this stage's process (tagged with it and the request id): the
        # traceback stays where the failure happened; the server logs the request's end, without it.
        if field is not None:  # the input was bad: the client's mistake (a 400), not this stage's
            log.info("%s (field %s)", error, field, extra={"request_id": request_id})
        else:
            log.error("%s", error, exc_info=exc, extra={"request_id": request_id})
        self.ports.send_failure(request_id, self.name, error, field=field)
        self._abort_in_scheduler(request_id)
        self._forget(request_id)

    def _took(self, message: IncomingMessage) -> None:
        """The scheduler took ``message``: a caller's chunk is counted, to be told this loop turn."""
        if message.kind is not IncomingKind.STREAM_CHUNK or message.source != INPUT_SOURCE:
            return
        rid = message.request_id
        self._input_taken[rid] = self._input_taken.get(rid, 0) + 1
        first = not self._input_untold
        self._input_untold.add(rid)
        if first:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # driven without a loop (a unit test): told at once
                self._tell_taken()
                return
            loop.call_soon(self._tell_taken)

    def _tell_taken(self) -> None:
        untold, self._input_untold = self._input_untold, set()
        for rid in untold:
            taken = self._input_taken.get(rid)
            if taken is not None and self.on_input_taken is not None:
                self.on_input_taken(self.name, rid, taken)

    def _forget(self, request_id: str) -> None:
        self._input_taken.pop(request_id, None)
        self._contexts.pop(request_id, None)
        self._stream_seq.pop(request_id, None)
        self._streaming_in.discard(request_id)
        self.fanin.drop(request_id)
        self._finished.add(request_id)

    # --- introspection ----------------------------------------------------------------

    def inbox_full(self) -> bool:
        """Whether ``relay.inbox`` requests wait here for the scheduler (backpressure)."""
        return self.scheduler.load().waiting() >= self.spec.relay.inbox

    def check_inbox(self) -> None:
        """Tell ``on_inbox`` when the inbox turned full or has room again. Called on each
        arrival while it has room and each output while it is full (both events, not a
        poll: admission is held meanwhile, and a 5 ms poll held a pipeline of microsecond
        stages to 60% of its rate), and by the worker's slow poll (a scheduler may take
        from its inbox without an output)."""
        full = self.inbox_full()
        if full != self._full:
            self._full = full
            if self.on_inbox is not None:
                self.on_inbox(self.name, full)

    def stats(self, slots_in_use: int) -> StageStats:
        load = self.scheduler.load()
        group = tp_group.running(self.name)
        ranks = group.follower_kv_slots() if group is not None else None
        return StageStats(
            # any state at all: a stream's sequence left behind counts, as the context would
            requests=len(self._contexts.keys() | self._stream_seq.keys() | self._streaming_in),
            fanin_buffers=len(self.fanin),
            queued=load.queued,
            running=load.running,
            stream_buffers=len(self._streaming_in) + load.stream_buffers,
            kv_slots=load.kv_slots,
            slots_in_use=slots_in_use,
            busy_s=round(self.scheduler.busy_seconds(), 3),
            rank_kv_slots=ranks or [],
        )
