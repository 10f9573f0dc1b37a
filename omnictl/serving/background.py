"""A server on its own thread and event loop, for callers that also run a client (bench, tests).

The server keeps its own loop so that the caller's work (a load generator parsing
thousands of events) does not sit in the same queue as the coordinator's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType

from omnictl.exceptions import LaunchError
from omnictl.serving.config import ServeConfig
from omnictl.serving.server import Listening, run_server


class BackgroundServer:
    """``with BackgroundServer(config, start_timeout) as listening: ...``"""

    def __init__(self, config: ServeConfig, start_timeout: float = 600.0) -> None:
        self.config = config
        self.start_timeout = start_timeout
        self._ready = threading.Event()
        self._listening: Listening | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serving: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="omnictl-server", daemon=True)

    def _main(self) -> None:
        async def on_ready(listening: Listening) -> None:
            self._listening = listening
            self._ready.set()

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._serving = asyncio.current_task()
            await run_server(self.config, on_ready, handle_signals=False)

        try:
            asyncio.run(serve())
        except BaseException as exc:  # handed to the caller's thread by __enter__
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> Listening:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._ready.wait(timeout=0.2):
            if time.monotonic() > deadline:
                # Not left loading behind the caller's back: the launch is cancelled, which
                # stops the stage processes it started, before the error is raised.
                if self._loop is not None and self._serving is not None:
                    self._loop.call_soon_threadsafe(self._serving.cancel)
                self._thread.join(timeout=60)
                raise LaunchError("http", f"the server did not become ready within {self.start_timeout:g}s")
        if self._listening is None:
            raise LaunchError("http", f"the server stopped before it was ready: {self._error}") from self._error
        return self._listening

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._loop is not None and self._listening is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._listening.stop)
        self._thread.join(timeout=60)
