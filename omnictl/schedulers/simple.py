"""The simple scheduler: one function call per request.

Wraps what a factory returns when it is not a Scheduler: a plain function, an
``async def`` function, or a generator function whose yields are stream chunks and
whose return value is the result. Sync functions run in one worker thread per stage
(model code need not be thread-safe, and the event loop stays free for IO).
Stream chunks sent *to* a simple stage are not consumed: use a StreamingScheduler.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from omnictl.exceptions import InvalidRequest
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)

def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frame, enough to find the bug."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


class SimpleScheduler(Scheduler):
    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        super().__init__()
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)
        self._is_generator = inspect.isgeneratorfunction(fn)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage")
        self._running: set[str] = set()
        self._aborted: set[str] = set()  # running, result to be discarded

    async def stop(self) -> None:
        await super().stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        while True:
            message = await self.inbox.get()
            if message.kind is IncomingKind.NEW_REQUEST:
                await self._execute(message)
            del message  # idle, this frame must not keep the last input (maybe a leased shm slot) alive

    async def _execute(self, message: IncomingMessage) -> None:
        rid = message.request_id
        self._running.add(rid)
        self.profile(EventKind.BUILD_START, rid)
        try:
            if self._is_async:
                result = await self.fn(message.data)
            elif self._is_generator:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self._executor, self._drain_generator, message)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self._executor, self.fn, message.data)
        except Exception as exc:  # the function's failure is this request's failure only
            if rid not in self._aborted:
                field = exc.field if isinstance(exc, InvalidRequest) else None
                self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=describe_error(exc), field=field))
        else:
            if rid not in self._aborted:
                self.profile(EventKind.BUILD_END, rid)
                self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, data=result))
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
        return SchedulerLoad(queued=self.inbox.qsize(), running=len(self._running))
