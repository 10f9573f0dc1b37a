"""Every process replica as a thread of this process: ``launcher="threads"``.

For tests, debugging and notebooks, where starting a fresh interpreter per replica costs
more than the work: each replica is the same :class:`~omnictl.stage.worker.Worker` the local
launcher runs in its own OS process, on its own thread and event loop here, reached over the
same ipc sockets and shared memory. What a process boundary gives is gone, and so is what
relies on it:

- a replica cannot be killed: :meth:`ThreadHandle.kill` asks its worker to stop, and a
  worker stuck inside a model call stops only when the call returns (use the local launcher
  for fault tests);
- a stage that crashes the interpreter takes the caller with it;
- stage code shares this process's modules: two topologies whose own ``stages.py`` are
  launched at once see the first one imported (one after the other is fine: a launch forgets
  the modules it imported from its topology's folder when it stops);
- stages log through this process's logging, not to ``<run_dir>/logs/<replica>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

from omnictl.coordinator.launcher import ReplicaConfigs, until_ended
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import describe_error
from omnictl.launch_config import LaunchConfig
from omnictl.stage.startup import WorkerConfig
from omnictl.stage.worker import Worker
from omnictl.topology.imports import forget_modules_from
from omnictl.topology.model import Topology

log = logging.getLogger(__name__)


@dataclass
class ThreadHandle:
    """One replica running as a thread of this process."""

    name: str
    restarts: int = 0
    ready: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    thread: threading.Thread | None = None
    exit_reason: str | None = None  # set when its worker has returned (or raised)
    _worker: Worker | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop_asked: bool = False

    @property
    def pid(self) -> int:
        return os.getpid()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def describe_exit(self) -> str:
        return self.exit_reason or "still running"

    def kill(self) -> None:
        """A thread cannot be killed: its worker is asked to stop (see the module's note)."""
        self.stop()

    def stop(self) -> None:
        # Asked first, then the loop read: either the thread sees the request once its worker
        # exists, or this sees the loop the worker runs on (see _run).
        self._stop_asked = True
        loop, worker = self._loop, self._worker
        if loop is not None and worker is not None:
            with contextlib.suppress(RuntimeError):  # its loop has just closed: it stopped already
                loop.call_soon_threadsafe(worker.stop)

    def reported_ready(self, pid: int) -> None:
        if not self.ready.done():
            self.ready.set_result(None)


class ThreadLauncher:
    """The :class:`~omnictl.coordinator.launching.ProcessLauncher` whose replicas are threads
    of this process, started with what the local launcher starts its processes with."""

    def __init__(
        self,
        topology: Topology,
        config: LaunchConfig,
        wiring: Wiring,
        on_exit: Callable[[str, str], None],  # (replica, how it ended)
    ) -> None:
        self.configs = configs = ReplicaConfigs(topology, config, wiring)
        self.on_exit = on_exit
        self.tcp_ports = configs.tcp_ports
        self.node_of = configs.node_of
        self.process_of = configs.process_of
        self.handles: dict[str, ThreadHandle] = {}
        self._stopping = False
        self._added_path = False  # this launch put its topology's folder on sys.path

    def start(self, name: str) -> ThreadHandle:
        """Start (or restart) the replica ``name`` on a thread of its own."""
        directory = self.configs.topology_dir
        if directory is not None and str(directory) not in sys.path:
            # On sys.path for the launch, as a stage process has it from its start: the
            # replicas build at once, and each import adding and removing it for itself
            # (import_path) would take it away from under another's.
            sys.path.insert(0, str(directory))
            self._added_path = True
        # parent_pid 0: no parent to watch, this process is its life (as for a Ray actor)
        config = self.configs.of(name, parent_pid=0, log_to_file=False)
        restarts = self.handles[name].restarts + 1 if name in self.handles else 0
        handle = self.handles[name] = ThreadHandle(name, restarts)
        loop = asyncio.get_running_loop()
        handle.thread = threading.Thread(
            target=self._run, args=(handle, config, loop), name=f"omnictl-stage-{name}", daemon=True
        )
        handle.thread.start()
        return handle

    def _run(self, handle: ThreadHandle, config: WorkerConfig, caller: asyncio.AbstractEventLoop) -> None:
        async def serve() -> None:
            worker = Worker(config)
            handle._loop, handle._worker = asyncio.get_running_loop(), worker
            if handle._stop_asked:
                worker.stop()
            await worker.run()

        try:
            asyncio.run(serve())
            handle.exit_reason = "its worker stopped"
        except BaseException as exc:  # reported to the coordinator as the replica's end, once
            handle.exit_reason = f"its worker raised {describe_error(exc)}"
            log.error("stage replica %r (a thread of this process) ended: %s", handle.name, handle.exit_reason)
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody to tell
            caller.call_soon_threadsafe(self._thread_ended, handle)

    def _thread_ended(self, handle: ThreadHandle) -> None:
        if not self._stopping and self.handles.get(handle.name) is handle:
            self.on_exit(handle.name, handle.describe_exit())

    async def retire(self, name: str, timeout: float = 5.0) -> None:
        """Stop the replica ``name``'s worker; forgotten first, so its end is not reported."""
        handle = self.handles.pop(name)
        handle.stop()
        await until_ended([handle], timeout)

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop every replica's worker and wait for their threads (a worker stuck inside a
        model call past ``timeout`` is left to end on its own, and said so)."""
        self._stopping = True
        handles = list(self.handles.values())
        for handle in handles:
            handle.stop()
        await until_ended(handles, timeout)
        for handle in handles:
            if handle.alive():
                log.warning(
                    "stage replica %r did not stop within %gs (a thread cannot be killed)", handle.name, timeout
                )
        directory = self.configs.topology_dir
        if self._added_path and directory is not None:
            with contextlib.suppress(ValueError):  # user code may have removed it itself
                sys.path.remove(str(directory))
            forget_modules_from(directory)
            self._added_path = False
