"""How a pipeline is launched: one frozen value, built once and passed whole.

The CLI (``omnictl serve``), the server (:class:`~omnictl.serving.server.ServeOptions`) and
the Python API (:meth:`omnictl.Pipeline.launch`) each build one :class:`LaunchConfig`; the
pipeline, the coordinator and the launchers read their knobs from it instead of passing
them along one by one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnictl.playback.policy import check_policy

if TYPE_CHECKING:
    from omnictl.topology.model import Topology

LAUNCHERS = ("local", "ray")


@dataclass(frozen=True)
class LaunchConfig:
    """Every launch knob, with its default. See :meth:`omnictl.Pipeline.launch` for each."""

    model_path: str | None = None  # None: the topology's own `model_path`
    device: str | None = None  # "cpu" drops the GPU placement
    run_dir: Path | None = None  # the profile and the logs; None: a fresh one under the user state dir
    profile: bool = True
    request_timeout: float = 300.0  # seconds a request may take before it fails
    ready_timeout: float = 120.0  # seconds every stage process may take to load
    max_restarts: int = 0  # per replica: how often a dead stage process is started again
    # how often a request its caller saw nothing of yet is re-run from the entry after a
    # process it was pinned to died (0: it fails with the process)
    replay_limit: int = 1
    max_in_flight: int | None = None  # admission control; None: no limit
    max_queue_wait: float = 0.0  # seconds a request may wait for an admission slot
    otlp_endpoint: str | None = None  # an OTLP/HTTP collector's URL; None: no trace export
    launcher: str = "local"  # "local" (OS processes) or "ray" (actors placed by `node` label)
    ray_address: str | None = None  # the Ray cluster to join; None: Ray's default
    data_host: str | None = None  # the address tcp sockets bind and advertise; None: $OMNICTL_DATA_HOST, ...
    # how stages that make audio for several streams pick the next: "fifo" or "deadline"
    # (least playback slack first; see omnictl.playback.policy)
    audio_policy: str = "fifo"

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, not {self.launcher!r}")
        if self.run_dir is not None and not isinstance(self.run_dir, Path):
            object.__setattr__(self, "run_dir", Path(self.run_dir))
        for name in ("request_timeout", "ready_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, not {getattr(self, name)!r}")
        check_policy(self.audio_policy)
        for name in ("max_restarts", "replay_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)!r}")

    def model_path_for(self, topology: Topology) -> str | None:
        """Where the weights are: this config's ``model_path``, else the topology's."""
        return self.model_path if self.model_path is not None else topology.model_path

    @property
    def remote(self) -> bool:
        """Every process is reached over tcp (the Ray launcher)."""
        return self.launcher == "ray"

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with ``changes`` (checked like a new config)."""
        return dataclasses.replace(self, **changes)
