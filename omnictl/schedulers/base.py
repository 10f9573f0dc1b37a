"""The one interface between a Stage and the model side: two queues plus lifecycle.

A Stage puts :class:`IncomingMessage` on ``scheduler.inbox`` and receives each
:class:`OutgoingMessage` through ``scheduler.deliver``, a callback run on the loop (no
queue and no task wake-up per output), or, when none is set (a scheduler driven alone,
in tests), from ``scheduler.outbox``. It never looks at which kind of scheduler it
drives. Schedulers that compute in a worker thread hand results back with
:meth:`Scheduler.emit`, which is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import enum
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from omnictl.handoff import Handoff
from omnictl.profiling.events import EventKind, MetaValue, NullProfiler, Profiler


class IncomingKind(str, enum.Enum):
    NEW_REQUEST = "new_request"  # the (fanned-in) input of one request
    STREAM_CHUNK = "stream_chunk"  # an increment from an upstream that streams to this stage
    STREAM_DONE = "stream_done"  # that upstream finished streaming for this request


class OutgoingKind(str, enum.Enum):
    RESULT = "result"  # the request is done at this stage; data goes downstream
    STREAM = "stream"  # an increment for `stream_to` targets (and the client, on a terminal)
    ERROR = "error"  # this request failed here; `error` says why


@dataclass(slots=True)
class IncomingMessage:
    kind: IncomingKind
    request_id: str
    data: Any = None
    source: str | None = None  # upstream stage (stream messages)
    params: Mapping[str, Any] = field(default_factory=dict)  # request parameters


@dataclass(slots=True)
class OutgoingMessage:
    kind: OutgoingKind
    request_id: str
    data: Any = None
    error: str | None = None
    # The request's field at fault when the input itself was bad (an InvalidRequest's
    # ``field``): the client gets a 400 naming it instead of a 500.
    field: str | None = None
    # The exception behind an ERROR, if any: the stage logs its traceback (once, in its process).
    exc: BaseException | None = None


@dataclass(slots=True)
class SchedulerLoad:
    """How many requests the scheduler holds state for, by kind (for `Pipeline.stats`)."""

    queued: int = 0
    running: int = 0
    kv_slots: int = 0
    stream_buffers: int = 0
    # Requests with work waiting here, when ``queued`` counts units of work instead (a
    # speech stage's sentences): backpressure counts requests, what holds a stage's
    # capacity; one request's 1,000 queued sentences once closed admission for everyone.
    # None: ``queued`` already counts requests.
    waiting_requests: int | None = None

    def waiting(self) -> int:
        """Requests waiting for this scheduler: what ``relay.inbox`` bounds (backpressure)."""
        return self.queued if self.waiting_requests is None else self.waiting_requests


class Inbox(asyncio.Queue[IncomingMessage]):
    """A scheduler's inbox: an asyncio queue that tells ``on_take`` of each message a
    scheduler takes from it (``get`` ends in ``get_nowait``), so the Stage knows how far the
    scheduler got through a streamed input (the caller's credit to send more)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_take: Callable[[IncomingMessage], None] | None = None

    def get_nowait(self) -> IncomingMessage:
        message = super().get_nowait()
        if self.on_take is not None:
            self.on_take(message)
        return message


class Scheduler(ABC):
    """Base class: owns the two queues; subclasses consume ``inbox`` in :meth:`run`."""

    def __init__(self) -> None:
        self.inbox: Inbox = Inbox()
        self.outbox: asyncio.Queue[OutgoingMessage] = asyncio.Queue()
        # Set by the Stage before `start`: outputs go to it, each in a loop callback of its
        # own (so a scheduler is never re-entered from inside its own emit).
        self.deliver: Callable[[OutgoingMessage], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # Messages emitted from worker threads reach the loop in one callback per burst
        # (not one wake-up per message: a streaming stage emits thousands); set at `start`.
        self._emitted: Handoff[OutgoingMessage] | None = None
        # The Stage attaches its process's recorder and its name before `start`.
        self.profiler: Profiler = NullProfiler()
        self.stage_name: str | None = None
        # time.monotonic() when the model call now running started (None: none is): /health
        # shows a stage stuck in one long step. Written by the compute thread, read by the loop.
        self.busy_since: float | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark the block as one compute step (a model call) for :meth:`busy_seconds`."""
        self.busy_since = time.monotonic()
        try:
            yield
        finally:
            self.busy_since = None

    def busy_seconds(self) -> float:
        """How long the compute step now running has run (0.0 when idle)."""
        since = self.busy_since
        return 0.0 if since is None else time.monotonic() - since

    def profile(self, kind: EventKind, request_id: str, **meta: MetaValue) -> None:
        """Record a profiling event for this stage (build, prefill, decode steps...)."""
        self.profiler.record(kind, request_id, self.stage_name, **meta)

    @contextmanager
    def computing(self, request_id: str, phase: str) -> Iterator[None]:
        """Time the block as this stage's compute phase ``phase`` (e.g. "synthesis"): the
        trace waterfall and the bench's breakdown show it by that name."""
        self.profile(EventKind.COMPUTE_START, request_id, phase=phase)
        try:
            yield
        finally:
            self.profile(EventKind.COMPUTE_END, request_id, phase=phase)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._emitted = Handoff(self._put, self._loop.call_soon_threadsafe)
        self._task = asyncio.create_task(self.run(), name=f"{type(self).__name__}.run")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def emit(self, message: OutgoingMessage) -> None:
        """Hand ``message`` to the Stage (:meth:`_put`); callable from worker threads too."""
        emitted = self._emitted
        if emitted is None:
            raise RuntimeError("scheduler not started")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            emitted.drain()  # what threads emitted before this stays ahead of it
            self._put(message)
        else:
            emitted.put(message)

    def _put(self, message: OutgoingMessage) -> None:
        """On the loop: one output to the Stage (in order: callbacks run first in, first out)."""
        if self.deliver is None:
            self.outbox.put_nowait(message)
        else:
            self._loop.call_soon(self.deliver, message)  # type: ignore[union-attr]  # started

    def offer(self, message: IncomingMessage) -> bool:
        """Take ``message`` at once, on the loop, instead of through the inbox; False (the
        default) when it should be queued. Outputs still go out through :meth:`emit`."""
        return False

    @abstractmethod
    async def run(self) -> None:
        """Consume ``inbox`` until cancelled."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Drop every piece of state held for ``request_id`` (queued, running, caches).

        The Stage has already taken the request's messages out of ``inbox``."""

    @abstractmethod
    def load(self) -> SchedulerLoad:
        """Current occupancy, cheap to compute."""
