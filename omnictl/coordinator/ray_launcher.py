"""Run each process replica as a Ray actor, placed by `node` label (``--launcher ray``).

A labelled process goes to an alive node started with ``--labels '{"omnictl-node": "LABEL"}'``
(``label_selector``); an unlabelled one to the coordinator's own node. The actor runs the same
:class:`~omnictl.stage.worker.Worker` the local launcher starts as an OS process, its
:class:`WorkerConfig` (CurveZMQ keys included) passed as a Ray call argument: typed msgpack bytes
(:mod:`omnictl.stage.startup`), decoded into the same dataclasses, never an unpickled object. Every address is
tcp: the worker binds its node's address (or ``data_host`` / ``$OMNICTL_DATA_HOST``) with an
OS-chosen port and reports it; the coordinator hands the address book out in its hellos.
Ray is imported only here, on first use.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from omnictl import logs
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import LaunchError
from omnictl.launch_config import LaunchConfig
from omnictl.stage.startup import WorkerConfig, decode_config, encode_config
from omnictl.topology.imports import topology_dir, worker_sys_path
from omnictl.topology.model import Topology

NODE_LABEL = "omnictl-node"


class StageActor:
    """One process replica; ``run`` returns when the worker stops (or never, if it dies)."""

    def __init__(self) -> None:
        self.worker: Any = None

    async def run(self, raw_config: bytes) -> None:
        from omnictl.stage.worker import Worker

        config = decode_config(raw_config)
        sys.path[:] = [*dict.fromkeys([*config.sys_path, *sys.path])]
        self.worker = Worker(config)
        await self.worker.run()

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


@dataclass
class RayHandle:
    name: str
    actor: Any
    node: str | None
    restarts: int = 0
    ready: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    pid: int = 0  # reported by the worker when ready
    exit_reason: str | None = None  # set once the actor is gone
    watcher: asyncio.Task[None] | None = None

    def alive(self) -> bool:
        return self.exit_reason is None

    def describe_exit(self) -> str:
        return self.exit_reason or "still running"

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)

    def reported_ready(self, pid: int) -> None:
        if not self.ready.done():
            self.pid = pid  # the worker's pid on its node: known only from its report
            self.ready.set_result(None)


def cluster_labels(nodes: list[dict[str, Any]]) -> list[str]:
    """The `omnictl-node` labels the alive nodes carry, sorted."""
    return sorted({n.get("Labels", {}).get(NODE_LABEL) for n in nodes if n.get("Alive")} - {None})


def check_labels(topology: Topology, labels: list[str]) -> None:
    """A label no alive node carries fails the launch at once, naming process and label."""
    for process in topology.processes.values():
        if process.node is not None and process.node not in labels:
            have = ", ".join(labels) or "none"
            raise LaunchError(
                process.stages[0],
                f"process {process.name!r} asks for node {process.node!r}, which no "
                f"alive Ray node carries (labels in the cluster: {have}); start one with "
                f'`ray start --address ... --labels \'{{"{NODE_LABEL}": "{process.node}"}}\'`',
            )


class RayLauncher:
    """The :class:`~omnictl.coordinator.launching.ProcessLauncher` over Ray actors."""

    def __init__(
        self,
        topology: Topology,
        config: LaunchConfig,
        wiring: Wiring,
        on_exit: Callable[[str, str], None],  # (process replica, how it ended)
    ) -> None:
        """``config``: the launch's (its model path, Ray address and audio policy);
        ``wiring``: its keys and the coordinator's and collector's tcp addresses, already
        bound (every worker reaches them over tcp)."""
        if wiring.tcp_coordinator is None or wiring.curve is None:
            raise ValueError("the Ray launcher needs the coordinator's tcp addresses and the launch's CurveZMQ keys")
        self.ray_address = config.placement.ray_address
        self.audio_policy = config.audio_policy
        self._owns_ray = False
        self._connected = False
        self.topology = topology
        self.model_path = config.model_path_for(topology)
        self.tcp_coordinator = wiring.tcp_coordinator
        self.profile_address = wiring.profile_tcp_address
        self.on_exit = on_exit
        self.curve = wiring.curve
        # as the operator gave it (None: each worker binds its own node's address)
        self.data_host = wiring.data_host_given
        self.handles: dict[str, RayHandle] = {}  # the current actor of each process replica
        self.started: list[RayHandle] = []  # every actor this launch started, relaunches included
        self.process_of = {name: p.name for p in topology.processes.values() for name in p.instances}
        self.node_of = {name: p.node for p in topology.processes.values() for name in p.instances}
        self.tcp_ports: dict[str, int] = {}
        self._stopping = False
        self._topology_dir = topology_dir(topology.path)
        self._home = ""
        self._actor_class: Any = None

    def _connect(self) -> None:
        """Join the cluster (unless this process already has) and check the labels, once."""
        import ray

        if not ray.is_initialized():
            ray.init(address=self.ray_address)
            self._owns_ray = True
        self._connected = True
        self._home = ray.get_runtime_context().get_node_id()  # unlabelled processes run here
        self._actor_class = ray.remote(StageActor)
        check_labels(self.topology, cluster_labels(ray.nodes()))

    def start(self, name: str) -> RayHandle:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not self._connected:
            self._connect()

        process = self.topology.processes[self.process_of[name]]
        control, broadcast = self.tcp_coordinator
        config = WorkerConfig(
            process=process.name,
            instance=name,
            topology=self.topology,
            model_path=self.model_path,
            process_addresses={},
            coordinator_address=control,
            broadcast_address=broadcast,
            profile_address=self.profile_address,
            parent_pid=0,
            sys_path=worker_sys_path(self._topology_dir, sys.path),
            node=process.node,
            data_host=self.data_host,
            tcp_port=self.tcp_ports.get(name, 0),
            curve=self.curve,
            audio_policy=self.audio_policy,
            # the server's level and format; no log file: the run directory is on the server's machine
            log_level=logs.settings().level,
            log_format=logs.settings().format,
        )
        options: dict[str, Any] = {
            "num_cpus": process.cpus,
            "num_gpus": len(process.gpus),
            "name": None,
            "max_concurrency": 4,
        }
        if process.node is not None:
            options["label_selector"] = {NODE_LABEL: process.node}
        else:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self._home, soft=False)
        actor = self._actor_class.options(**options).remote()
        restarts = self.handles[name].restarts + 1 if name in self.handles else 0
        handle = self.handles[name] = RayHandle(name, actor, process.node, restarts)
        self.started.append(handle)
        run = actor.run.remote(encode_config(config))  # typed msgpack bytes: nothing to unpickle
        handle.watcher = asyncio.get_running_loop().create_task(self._watch(handle, run))
        return handle

    async def _watch(self, handle: RayHandle, ref: Any) -> None:
        from ray.exceptions import RayError

        try:
            await ref
            handle.exit_reason = "its worker stopped"
        except RayError as exc:  # the actor died, or its node did
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            handle.exit_reason = f"its Ray actor died ({type(exc).__name__}: {first})"
        if not self._stopping and self.handles.get(handle.name) is handle:
            self.on_exit(handle.name, handle.exit_reason)

    async def retire(self, name: str, timeout: float = 5.0) -> None:
        """Ask the replica's worker to stop, then kill its actor; forgotten first, so its end
        is not reported as a death."""
        import ray

        handle = self.handles.pop(name)
        if handle.alive():
            handle.actor.stop.remote()
        if handle.watcher is not None:
            await asyncio.wait([handle.watcher], timeout=timeout)
            handle.watcher.cancel()
        ray.kill(handle.actor, no_restart=True)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop cleanly, then kill every actor: none is left behind."""
        import ray

        self._stopping = True
        if not self._connected:
            return
        handles = list(self.started)  # a predecessor that hung instead of dying is killed too
        for handle in handles:
            if handle.alive():
                handle.actor.stop.remote()
        watchers = [h.watcher for h in handles if h.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=timeout)
        for handle in handles:
            ray.kill(handle.actor, no_restart=True)
            if handle.watcher is not None:
                handle.watcher.cancel()
        if self._owns_ray:
            ray.shutdown()
