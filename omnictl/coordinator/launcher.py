"""Start, watch and stop one OS process per topology `process` replica (``NAME`` or ``NAME#i``).

Each starts as a fresh interpreter, except a replica of an elastic process once the launch's
template is up: that one is forked from it with omnictl's modules already imported (see
:mod:`omnictl.stage.template`), so a replica the autoscaler adds takes requests sooner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from omnictl import logs
from omnictl.coordinator.forking import ForkedProcess, Template
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import LaunchError
from omnictl.launch_config import LaunchConfig
from omnictl.pids import describe_exit
from omnictl.stage.startup import WorkerConfig, encode_config
from omnictl.topology.imports import topology_dir, worker_sys_path
from omnictl.topology.model import Topology

if TYPE_CHECKING:
    from omnictl.coordinator import launching  # the protocol every launcher's handles meet

log = logging.getLogger(__name__)
_TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"


@dataclass
class ProcessHandle:
    name: str  # the OS process (replica) name
    process: subprocess.Popen[bytes] | ForkedProcess
    pidfd: int  # readable once the process has exited (-1 for a forked one: its template reports that)
    restarts: int = 0
    ready: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe_exit(self) -> str:
        if isinstance(self.process, ForkedProcess) and self.process.why is not None:
            return self.process.why
        return describe_exit(self.process.returncode)

    def kill(self) -> None:
        self.process.kill()

    def reported_ready(self, pid: int) -> None:
        if not self.ready.done():  # the pid is known already: this launcher started the process
            self.ready.set_result(None)


async def until_ended(handles: Iterable[launching.ProcessHandle], timeout: float) -> None:
    """Until none of ``handles`` runs, or ``timeout``. Polled: a forked process's exit is known
    when its template's report is read, and a thread's when it returns, both on this loop."""
    handles = list(handles)
    deadline = asyncio.get_running_loop().time() + timeout
    while any(h.alive() for h in handles) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


class ReplicaConfigs:
    """What each process replica of a launch on this machine is started with (the local
    launcher's processes, the thread launcher's threads)."""

    def __init__(self, topology: Topology, config: LaunchConfig, wiring: Wiring) -> None:
        self.topology = topology
        self.model_path = config.model_path_for(topology)
        self.audio_policy = config.audio_policy
        self.wiring = wiring
        self.run_dir = config.profiling.run_dir  # each replica logs to <run_dir>/logs/<name>.log too
        self.tcp_ports: dict[str, int] = {}  # replica -> the port it reported (a restart asks for it again)
        self.node_of = {name: p.node for p in topology.processes.values() for name in p.instances}
        self.process_of = {name: p.name for p in topology.processes.values() for name in p.instances}
        # Resolved now: a restart later must not depend on the parent's working directory.
        self.topology_dir = topology_dir(topology.path)

    def of(self, name: str, *, parent_pid: int, log_to_file: bool) -> WorkerConfig:
        """What the replica ``name`` is started with: its process, the launch's addresses and
        keys (over tcp when it is on a labelled node), and the server's logging as it is now
        (a restart logs as the server does then). ``parent_pid``: the process it dies with
        (0: none, it lives in this one); ``log_to_file``: it logs to ``<run_dir>/logs/<name>.log``
        too."""
        log_settings = logs.settings()
        wiring = self.wiring
        control, broadcast = wiring.control_address, wiring.broadcast_address
        profile = wiring.profile_address
        node = self.node_of[name]
        if node is not None:  # on another node than the coordinator's: reach it over tcp
            if wiring.tcp_coordinator is None:
                raise LaunchError(
                    self.topology.processes[self.process_of[name]].stages[0],
                    f"process {name!r} is on node {node!r} but the coordinator takes no tcp",
                )
            control, broadcast = wiring.tcp_coordinator
            profile = wiring.profile_tcp_address or profile
        return WorkerConfig(
            process=self.process_of[name],
            instance=name,
            topology=self.topology,
            model_path=self.model_path,
            process_addresses=wiring.process_addresses,
            coordinator_address=control,
            broadcast_address=broadcast,
            profile_address=profile,
            parent_pid=parent_pid,
            # The topology's directory first: user code imports as in `validate --check-imports`.
            sys_path=worker_sys_path(self.topology_dir, sys.path),
            log_level=log_settings.level,
            log_format=log_settings.format,
            log_file=str(logs.log_file(self.run_dir, name)) if log_to_file and self.run_dir is not None else None,
            node=node,
            data_host=wiring.data_host,
            tcp_port=self.tcp_ports.get(name, 0),
            curve=wiring.curve,  # through the private stdin pipe, never a file
            audio_policy=self.audio_policy,
        )


class Launcher:
    """The local :class:`~omnictl.coordinator.launching.ProcessLauncher`: one OS process per
    process replica, on this machine."""

    def __init__(
        self,
        topology: Topology,
        config: LaunchConfig,
        wiring: Wiring,
        on_exit: Callable[[str, str], None],  # (OS process, how it exited)
    ) -> None:
        """``config``: the launch's (its model path, run directory and audio policy);
        ``wiring``: its addresses, keys and data host, already resolved (processes on a
        labelled node reach the coordinator and the collector over its tcp addresses)."""
        self.configs = configs = ReplicaConfigs(topology, config, wiring)
        self.wiring = wiring
        self.on_exit = on_exit
        self.tcp_ports = configs.tcp_ports  # OS process -> the port it reported (a restart asks for it again)
        self.node_of = configs.node_of
        self.process_of = configs.process_of
        self.handles: dict[str, ProcessHandle] = {}  # by OS process (replica) name
        self._stopping = False
        # the processes whose standby replicas the autoscaler may start (min below max)
        self._elastic = {p.name for p in topology.processes.values() if p.initial < p.replicas}
        self._template: Template | None = None  # started with the first start, for elastic processes only

    def start(self, name: str) -> ProcessHandle:
        """Start (or restart) the OS process ``name``: a process, or one replica of it."""
        config = self.configs.of(name, parent_pid=os.getpid(), log_to_file=True)
        restarts = self.handles[name].restarts + 1 if name in self.handles else 0
        forked = self._fork(name, config)
        if forked is not None:
            handle = self.handles[name] = ProcessHandle(name, forked, -1, restarts)
            forked.on_exit = lambda: self._exited(handle)
            if forked.returncode is not None:  # it ended before it was handed out
                asyncio.get_running_loop().call_soon(self._exited, handle)
            return handle
        # A fresh interpreter (not multiprocessing's spawn): the user's __main__ is never
        # re-imported, so scripts need no `if __name__ == "__main__"` guard.
        process = subprocess.Popen(
            [sys.executable, "-m", "omnictl.stage.worker"],
            stdin=subprocess.PIPE,
            env=self._environment(),
        )
        assert process.stdin is not None
        process.stdin.write(encode_config(config))
        process.stdin.close()
        handle = self.handles[name] = ProcessHandle(name, process, os.pidfd_open(process.pid), restarts)
        asyncio.get_running_loop().add_reader(handle.pidfd, self._exited, handle)
        return handle

    def _fork(self, name: str, config: WorkerConfig) -> ForkedProcess | None:
        """``name`` forked from the template, when it is a replica of an elastic process and
        the template is up; None: start it as a fresh interpreter. The template is started
        with the launch's first start, beside its first processes."""
        if not self._elastic or self._stopping:
            return None
        if self._template is None:
            self._template = Template(self._environment())
            return None
        if self.process_of[name] not in self._elastic or not self._template.ready:
            return None
        try:
            return self._template.fork(encode_config(config))
        except OSError as exc:  # logged once: every start from now on is a fresh interpreter
            log.error("replica %r is started as a fresh interpreter: %s", name, exc)
            self._template.close()
            self._template = None
            self._elastic = set()
            return None

    def _environment(self) -> dict[str, str]:
        """Split the cores between the stage processes: OpenMP threads that outnumber the
        cores spin against each other and make every forward pass several times slower."""
        env = dict(os.environ)
        # Model loaders' progress bars (transformers' "Loading weights") would interleave
        # across processes; each worker logs one line per stage it loaded instead.
        env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # When a stage process is killed, its resource tracker unlinks the shared memory it
        # left (by design) and says so with a bare "leaked shared_memory objects" warning on
        # the server's stderr, once per kill; the coordinator logs the death itself instead.
        warnings = [w for w in [env.get("PYTHONWARNINGS", ""), _TRACKER_WARNING] if w]
        env["PYTHONWARNINGS"] = ",".join(warnings)
        if "OMP_NUM_THREADS" not in env:
            cores = len(os.sched_getaffinity(0))
            env["OMP_NUM_THREADS"] = str(max(1, cores // len(self.process_of)))
        return env

    def _exited(self, handle: ProcessHandle) -> None:
        self._forget(handle)
        handle.process.wait()  # reaps a child of this process; a forked one is reaped already
        if not self._stopping and self.handles.get(handle.name) is handle:
            self.on_exit(handle.name, handle.describe_exit())

    def _forget(self, handle: ProcessHandle) -> None:
        if handle.pidfd >= 0:
            asyncio.get_running_loop().remove_reader(handle.pidfd)
            os.close(handle.pidfd)
            handle.pidfd = -1

    async def retire(self, name: str, timeout: float = 5.0) -> None:
        """SIGTERM the replica ``name`` (SIGKILL after ``timeout``); forgotten first, so its
        exit is not reported as a death."""
        handle = self.handles.pop(name)
        self._forget(handle)
        if handle.alive():
            handle.process.terminate()
        await until_ended([handle], timeout)
        if handle.alive():
            handle.process.kill()
            await until_ended([handle], timeout)
        handle.process.wait()

    async def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every process (workers shut down cleanly on it), then SIGKILL stragglers."""
        self._stopping = True
        for handle in self.handles.values():
            self._forget(handle)
            if handle.alive():
                handle.process.terminate()
        await until_ended(list(self.handles.values()), timeout)
        stragglers = [h for h in self.handles.values() if h.alive()]
        for handle in stragglers:
            handle.process.kill()
        await until_ended(stragglers, timeout)
        for handle in self.handles.values():
            handle.process.wait()
        if self._template is not None:
            self._template.close()
