"""The base of a scheduler whose model calls run in one worker thread.

The event loop takes each inbox message (:meth:`WorkerScheduler.accept`, quick: buffer,
window, decide) and hands the slow part to the stage's one worker thread
(:meth:`WorkerScheduler.submit`), where jobs run one at a time in the order submitted, so
the loop stays free and the model's threads are not shared by two calls at once. The thread
starts with the scheduler and is stopped with it: jobs still queued are dropped, the one
running is waited for (off the loop). Results go back with :meth:`Scheduler.emit`, which is
safe from the worker thread.

The streaming scheduler (``omnictl/schedulers/streaming.py``) and the voice assistant's
streamed recogniser (``omnictl/models/voice_assistant/asr_stream.py``) are built on it; a
scheduler does not start a worker thread of its own (``tests/test_layering.py``).
"""

from __future__ import annotations

import asyncio
import threading
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from omnictl.schedulers.base import IncomingMessage, Scheduler


class WorkerScheduler(Scheduler):
    """A scheduler with one worker thread: :meth:`accept` on the loop, :meth:`submit` to the thread."""

    # The thread's name is the stage's, or this when the scheduler runs without a stage (tests).
    worker_name = "worker"

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._jobs = 0  # submitted and not yet done (queued or running)
        self._jobs_lock = threading.Lock()

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{self.stage_name or self.worker_name}-worker"
        )
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            # the job running may take a while (a model call): wait for it off the loop
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)

    async def run(self) -> None:
        while True:
            self.accept(await self.inbox.get())  # no local: an idle loop keeps no input alive

    @abstractmethod
    def accept(self, message: IncomingMessage) -> None:
        """Take one inbox message, on the loop; hand what is slow to :meth:`submit`."""

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        """Run ``job(*args)`` in the worker thread after the jobs submitted before it. A job
        handles its own failure (it emits the request's error): the thread never reports one."""
        if self._executor is None:
            raise RuntimeError(f"{type(self).__name__}: submit before start (or after stop)")
        with self._jobs_lock:
            self._jobs += 1
        self._executor.submit(self._counted, job, *args)

    def jobs(self) -> int:
        """Jobs submitted and not yet done (for :meth:`load`)."""
        with self._jobs_lock:
            return self._jobs

    def _counted(self, job: Callable[..., None], *args: Any) -> None:
        try:
            job(*args)
        finally:
            with self._jobs_lock:
                self._jobs -= 1
