"""Where one launch's processes reach each other, and its keys: decided once, handed whole.

:meth:`Wiring.resolve` picks the ipc addresses (in the launch's socket directory), the data
host tcp sockets bind here, and the CurveZMQ keys (when any socket is tcp). The profiling
collector, the coordinator and whichever launcher runs the stage processes all read the
same value; the tcp addresses known only once bound (the coordinator's control and
broadcast sockets, the collector's) are added with :meth:`Wiring.with_tcp`.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omnictl.launch_config import LaunchConfig
from omnictl.topology.model import Topology
from omnictl.transports.curve import CurveKeys
from omnictl.transports.endpoint import resolve_data_host


@dataclass(frozen=True)
class Wiring:
    socket_dir: Path  # the ipc sockets' directory, removed on close
    # replica -> its ipc:// address (short paths: ipc:// addresses are limited to ~100 bytes)
    process_addresses: dict[str, str] = field(default_factory=dict)
    control_address: str = ""  # the coordinator's control socket (ipc)
    broadcast_address: str = ""  # the coordinator's abort broadcast (ipc)
    profile_address: str | None = None  # the profiling collector (ipc); None: not profiling
    data_host: str = "127.0.0.1"  # the address tcp sockets bind and advertise here, resolved
    # the data host the operator gave (config or $OMNICTL_DATA_HOST): a Ray worker resolves
    # its own node's address when None
    data_host_given: str | None = None
    curve: CurveKeys | None = None  # the launch's keys; every tcp socket is CurveZMQ when set
    tcp_coordinator: tuple[str, str] | None = None  # (control, broadcast) over tcp, once bound
    profile_tcp_address: str | None = None  # the collector over tcp, for processes on other nodes

    @classmethod
    def resolve(
        cls, topology: Topology, config: LaunchConfig, socket_dir: Path | None = None, *, profiling: bool = False
    ) -> Wiring:
        """This launch's wiring: the sockets in ``socket_dir`` (a fresh temporary directory
        by default), keys when some process is on another node or every one is reached over
        tcp (Ray), a profile address when ``profiling``."""
        socket_dir = socket_dir or Path(tempfile.mkdtemp(prefix="omnictl-"))
        placement = config.placement
        return cls(
            socket_dir=socket_dir,
            process_addresses={name: f"ipc://{socket_dir}/p{i}" for i, name in enumerate(topology.instances())},
            control_address=f"ipc://{socket_dir}/control",
            broadcast_address=f"ipc://{socket_dir}/broadcast",
            profile_address=f"ipc://{socket_dir}/profile" if profiling else None,
            data_host=resolve_data_host(placement.data_host, placement.launcher),
            data_host_given=placement.data_host or os.environ.get("OMNICTL_DATA_HOST"),
            curve=CurveKeys.generate() if topology.multi_node() or config.remote else None,
        )

    def with_tcp(self, *, coordinator: tuple[str, str] | None = None, profile: str | None = None) -> Wiring:
        """A copy with the tcp addresses just bound (those not given stay as they were)."""
        return dataclasses.replace(
            self,
            tcp_coordinator=coordinator or self.tcp_coordinator,
            profile_tcp_address=profile or self.profile_tcp_address,
        )
