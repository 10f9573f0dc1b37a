"""One asyncio loop in a background thread, so a module's tests can share a running
pipeline (launching one costs seconds: every stage process imports torch)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T], timeout: float = 120.0) -> T:
        async def wrap() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


def launch(loop: LoopThread, path: Any, **options: Any) -> Any:
    import omnictl

    # Waits as long as the launch may: its ready timeout, plus starting the processes.
    return loop.run(omnictl.Pipeline.launch(path, **options), timeout=options.get("ready_timeout", 120.0) + 60.0)
