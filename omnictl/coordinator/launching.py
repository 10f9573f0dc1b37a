"""What the coordinator needs of a launcher, whichever runs the stage processes.

Three launchers implement it: :class:`~omnictl.coordinator.launcher.Launcher` (one OS process
per process replica, on this machine), :class:`~omnictl.coordinator.ray_launcher.
RayLauncher` (one Ray actor each, placed by `node` label) and :class:`~omnictl.coordinator.
thread_launcher.ThreadLauncher` (one thread of this process each: tests and debugging). The coordinator is written
against these two protocols only and never asks which one it has: :func:`build_launcher`
chooses and builds it from the launch's config, each the same way.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

if TYPE_CHECKING:
    from omnictl.coordinator.wiring import Wiring
    from omnictl.launch_config import LaunchConfig
    from omnictl.topology.model import Topology


class ProcessHandle(Protocol):
    """One started process replica (``NAME`` or ``NAME#i``)."""

    name: str
    restarts: int  # how many times this replica was started again
    ready: asyncio.Future[None]  # resolved when its worker reports ready; fails with LaunchError

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def describe_exit(self) -> str:
        """How it ended (``killed by SIGKILL``, ``its Ray actor died (...)``), or ``still running``."""
        ...

    def kill(self) -> None: ...

    def reported_ready(self, pid: int) -> None:
        """Its worker said it is ready, running as ``pid`` on its machine."""
        ...


class ProcessLauncher(Protocol):
    """Starts, watches and stops the process replicas of one topology. A replica that ends
    on its own is reported to the ``on_exit`` callback the launcher was built with."""

    @property
    def handles(self) -> Mapping[str, ProcessHandle]:
        """The current handle of each process replica."""
        ...

    process_of: dict[str, str]  # replica -> its topology process
    node_of: dict[str, str | None]  # replica -> its `node` label (None: the coordinator's machine)
    tcp_ports: dict[str, int]  # replica -> the tcp port it reported (asked for again on restart)

    def start(self, name: str) -> ProcessHandle:
        """Start (or restart) the replica ``name``."""
        ...

    async def retire(self, name: str, timeout: float = 5.0) -> None:
        """Stop the replica ``name`` on purpose (the autoscaler removes it): its exit is not
        reported, and a later :meth:`start` of it is a fresh start, not a restart."""
        ...

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop every replica; none is left behind."""
        ...


def build_launcher(
    topology: Topology, config: LaunchConfig, wiring: Wiring, on_exit: Callable[[str, str], None]
) -> ProcessLauncher:
    """The launcher ``config.placement.launcher`` names, given the launch's config and
    wiring whole; ``on_exit(replica, how)`` hears of each replica that ends on its own."""
    if config.remote:
        from omnictl.coordinator.ray_launcher import RayLauncher  # Ray itself is imported on first use

        return RayLauncher(topology, config, wiring, on_exit)
    if config.placement.launcher == "threads":
        from omnictl.coordinator.thread_launcher import ThreadLauncher

        return ThreadLauncher(topology, config, wiring, on_exit)
    from omnictl.coordinator.launcher import Launcher

    return Launcher(topology, config, wiring, on_exit)
