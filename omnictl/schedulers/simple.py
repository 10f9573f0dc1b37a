"""The simple scheduler: one function call per request.

Wraps what a factory returns when it is not a Scheduler: a plain function, an
``async def`` function, or a generator function whose yields are stream chunks and
whose return value is the result. Sync functions run in one worker thread per stage
(model code need not be thread-safe, and the event loop stays free for IO) -- except a
plain function measured to take microseconds (its last calls all quick, in the thread;
see ``SimpleScheduler._time``): it then runs on the event loop itself, saving two thread
wake-ups per request, until a call is slow (then back to the thread).
Routing, projection and detokenizing stages are such functions; models are not.
Stream chunks sent *to* a simple stage are not consumed: use a StreamingScheduler.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import queue
import threading
import time
from typing import Any, Callable

from omnictl.exceptions import InvalidRequest, describe_error
from omnictl.logs import request_scope
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)

INLINE_BELOW_S = 100e-6  # a plain function every call of which is quicker runs on the loop
_PROBE_CALLS = 16  # quick calls in a row, in the worker thread, before a function may run on the loop


class SimpleScheduler(Scheduler):
    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        super().__init__()
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)
        self._is_generator = inspect.isgeneratorfunction(fn)
        # One worker thread per stage, fed batches through a C-level queue: cheaper per
        # hand-off than a ThreadPoolExecutor (whose submit takes Python-level locks and
        # semaphores, measured at 12% of a busy stage process's loop).
        self._jobs: queue.SimpleQueue[tuple[collections.deque[IncomingMessage], asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._running: set[str] = set()  # handed to the worker thread (or on the loop), not finished
        self._batch: collections.deque[IncomingMessage] = collections.deque()  # handed over, not started
        self._aborted: set[str] = set()  # running, result to be discarded
        self._quick_streak = 0  # a plain function's quick calls in a row
        self._slow = self._is_async or self._is_generator  # True: never on the loop

    async def stop(self) -> None:
        await super().stop()
        if self._thread is not None:
            self._jobs.put(None)  # not joined: it may be inside a model call; it is a daemon
            self._thread = None

    def _work(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker thread: run each batch, then tell the loop it is done."""
        while (job := self._jobs.get()) is not None:
            batch, done = job
            del job
            error: BaseException | None = None
            try:
                self._run_batch(batch)
            except BaseException as exc:  # reported to the awaiting loop, as an executor would
                error = exc
            del batch
            if loop.is_closed():
                return  # the stage's loop is gone (shut down while this batch ran)
            try:
                loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:  # closed just now
                return
            del done, error

    async def _in_thread(self, batch: collections.deque[IncomingMessage]) -> None:
        loop = asyncio.get_running_loop()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, args=(loop,), name=f"stage-{self.stage_name}", daemon=True
            )
            self._thread.start()
        done: asyncio.Future[None] = loop.create_future()
        self._jobs.put((batch, done))
        await done

    async def run(self) -> None:
        while True:
            # Every request already queued goes to the worker thread in one hand-off: one
            # thread wake-up per burst instead of one per request (results still leave
            # one by one, as each finishes).
            batch = collections.deque([await self.inbox.get()])
            while not self.inbox.empty():
                batch.append(self.inbox.get_nowait())
            batch = collections.deque(message for message in batch if message.kind is IncomingKind.NEW_REQUEST)
            if self._is_async:
                while batch:
                    await self._execute(batch.popleft())
                continue
            ids = [message.request_id for message in batch]
            self._running.update(ids)
            self._batch = batch
            try:
                if self._slow or self._quick_streak < _PROBE_CALLS:
                    await self._in_thread(batch)
                else:
                    self._run_batch(batch)  # measured quick: on the loop, no thread hop
            finally:
                self._batch = collections.deque()
                self._running.difference_update(ids)
                self._aborted.difference_update(ids)
            del batch  # idle, this frame must not keep the last inputs (maybe leased shm slots) alive

    def offer(self, message: IncomingMessage) -> bool:
        """A function measured quick runs the request right here when nothing is queued
        ahead of it: no wake-up of the scheduler's task for it (a third of a no-op stage's
        time on the loop)."""
        if (
            self._slow
            or self._quick_streak < _PROBE_CALLS
            or message.kind is not IncomingKind.NEW_REQUEST
            or self._running
            or not self.inbox.empty()
        ):
            return False
        self._running.add(message.request_id)
        try:
            self._run_batch(collections.deque([message]))
        finally:
            self._aborted.discard(message.request_id)
        return True

    def _run_batch(self, batch: collections.deque[IncomingMessage]) -> None:
        """In the worker thread (or, for a quick function, on the loop): run each request in
        turn; a request aborted meanwhile is skipped, and a result or error of one aborted
        while it ran is dropped."""
        while batch:
            message = batch.popleft()  # popped: done, its input is not kept alive by the batch
            rid = message.request_id
            if rid in self._aborted:
                self._running.discard(rid)
                continue
            self.profile(EventKind.BUILD_START, rid)
            result = None
            # Records the stage's code logs while on this request carry its id.
            with request_scope(rid), self.busy():
                try:
                    if self._is_generator:
                        result = self._drain_generator(message)
                    else:
                        started, cpu_started = time.perf_counter(), time.thread_time()
                        result = self.fn(message.data)
                        self._time(time.perf_counter() - started, time.thread_time() - cpu_started)
                except Exception as exc:  # the function's failure is this request's failure only
                    self._failed(rid, exc)
                else:
                    self._succeeded(rid, result)
                finally:
                    self._running.discard(rid)  # from another thread: set operations hold the GIL
            del message, result

    def _failed(self, rid: str, exc: Exception) -> None:
        if rid not in self._aborted:
            field = exc.field if isinstance(exc, InvalidRequest) else None
            # Bad input is the client's to fix: its message, not where in the server it was found.
            error = str(exc) if isinstance(exc, InvalidRequest) else describe_error(exc)
            self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=error, field=field, exc=exc))

    def _succeeded(self, rid: str, result: Any) -> None:
        if rid not in self._aborted:
            self.profile(EventKind.BUILD_END, rid)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, data=result))

    def _time(self, wall: float, cpu: float) -> None:
        """One plain call's duration. A call that computed (thread CPU time) for half the
        threshold or more sends the function to the thread for good. One that took ten
        times the threshold without computing waited on something -- IO, a lock, or just
        the OS on a busy machine: back to the thread until it has again been quick
        ``_PROBE_CALLS`` times in a row there (a function that always waits never is)."""
        if cpu >= INLINE_BELOW_S / 2 and wall >= INLINE_BELOW_S:
            self._slow = True
        elif wall >= 10 * INLINE_BELOW_S:
            self._quick_streak = 0
        else:
            self._quick_streak += 1

    async def _execute(self, message: IncomingMessage) -> None:
        """An ``async def`` function's request, on the loop."""
        rid = message.request_id
        self._running.add(rid)
        self.profile(EventKind.BUILD_START, rid)
        try:
            with request_scope(rid), self.busy():
                result = await self.fn(message.data)
        except Exception as exc:  # the function's failure is this request's failure only
            self._failed(rid, exc)
        else:
            self._succeeded(rid, result)
        finally:
            self._running.discard(rid)
            self._aborted.discard(rid)

    def _drain_generator(self, message: IncomingMessage) -> Any:
        rid = message.request_id
        generator = self.fn(message.data)
        while True:
            if rid in self._aborted:
                generator.close()
                return None
            try:
                chunk = next(generator)
            except StopIteration as stop:
                return stop.value
            self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, data=chunk))

    def abort(self, request_id: str) -> None:
        # Queued work needs nothing here: the Stage takes the request's messages out of
        # the inbox before it calls abort.
        if request_id in self._running:
            self._aborted.add(request_id)  # its result is discarded; a generator stops at its next yield

    def load(self) -> SchedulerLoad:
        # Requests handed to the worker thread and not started yet are queued, as they
        # were in the inbox: backpressure (Stage.inbox_full) counts them.
        waiting = len(self._batch)
        return SchedulerLoad(queued=self.inbox.qsize() + waiting, running=max(0, len(self._running) - waiting))


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():  # the awaiting task was cancelled (the stage is stopping)
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
