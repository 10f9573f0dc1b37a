"""How a pipeline is launched: one frozen value made of parts, built once and passed whole.

:class:`LaunchConfig` holds what every stage needs (the weights, the device, the timeouts,
the audio policy) and four parts: :class:`FaultConfig` (restarts and replays),
:class:`AdmissionConfig` (how many requests run at once), :class:`ProfilingConfig` (the run
directory, traces) and :class:`PlacementConfig` (which launcher, where tcp binds). Each part
checks its own values when it is made, so a bad knob fails before any process starts.

The CLI (``omnictl serve``) builds a :class:`~omnictl.serving.config.ServeConfig` around
one; the Python API (:meth:`omnictl.Pipeline.launch`) builds one from its keyword arguments
(the flat names of :class:`LaunchOptions`); the pipeline, the coordinator and the launchers
read their knobs from it instead of passing them along one by one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from omnictl.playback.policy import DEFAULT_POLICY, check_policy

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from omnictl.topology.model import Topology

LAUNCHERS = ("local", "ray", "threads")


def check_admission(max_in_flight: int | None, max_queue_wait: float) -> None:
    """The admission limits' rule, for :class:`AdmissionConfig` and :class:`omnictl.admission.Admission`."""
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1 (or None: no limit), got {max_in_flight}")
    if max_queue_wait < 0:
        raise ValueError(f"max_queue_wait must be 0 or more seconds, got {max_queue_wait}")


@dataclass(frozen=True)
class FaultConfig:
    """What happens when a stage process dies."""

    max_restarts: int = 0  # per replica: how often a dead stage process is started again
    # how often a request its caller saw nothing of yet is re-run from the entry after a
    # process it was pinned to died (0: it fails with the process)
    replay_limit: int = 1

    def __post_init__(self) -> None:
        for name in ("max_restarts", "replay_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)!r}")


@dataclass(frozen=True)
class AdmissionConfig:
    """Admission control (see :mod:`omnictl.admission`)."""

    max_in_flight: int | None = None  # None: no limit (the Python API's default; a server's is 64)
    max_queue_wait: float = 0.0  # seconds a request may wait for an admission slot

    def __post_init__(self) -> None:
        check_admission(self.max_in_flight, self.max_queue_wait)


@dataclass(frozen=True)
class ProfilingConfig:
    """What is recorded of each request, and where."""

    profile: bool = True
    run_dir: Path | None = None  # the profile and the logs; None: a fresh one under the user state dir
    otlp_endpoint: str | None = None  # an OTLP/HTTP collector's URL; None: no trace export

    def __post_init__(self) -> None:
        if self.run_dir is not None and not isinstance(self.run_dir, Path):
            object.__setattr__(self, "run_dir", Path(self.run_dir))


@dataclass(frozen=True)
class PlacementConfig:
    """Which launcher runs the stage processes, and where their tcp sockets bind."""

    # "local" (OS processes), "ray" (actors placed by `node` label) or "threads" (threads of
    # this process: tests and debugging, see omnictl.coordinator.thread_launcher)
    launcher: str = "local"
    ray_address: str | None = None  # the Ray cluster to join; None: Ray's default
    data_host: str | None = None  # the address tcp sockets bind and advertise; None: $OMNICTL_DATA_HOST, ...

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, not {self.launcher!r}")


class LaunchOptions(TypedDict, total=False):
    """:meth:`omnictl.Pipeline.launch`'s keyword arguments: every knob by its flat name
    (see :meth:`LaunchConfig.replace`)."""

    model_path: str | None
    device: str | None
    request_timeout: float
    ready_timeout: float
    input_window: int
    input_wait: float
    audio_policy: str
    max_restarts: int
    replay_limit: int
    max_in_flight: int | None
    max_queue_wait: float
    profile: bool
    run_dir: Path | str | None
    otlp_endpoint: str | None
    launcher: str
    ray_address: str | None
    data_host: str | None


# each part's fields, by the part's name in LaunchConfig
_PARTS: dict[str, type[Any]] = {
    "faults": FaultConfig,
    "admission": AdmissionConfig,
    "profiling": ProfilingConfig,
    "placement": PlacementConfig,
}
_PART_OF = {f.name: part for part, kind in _PARTS.items() for f in dataclasses.fields(kind)}


@dataclass(frozen=True)
class LaunchConfig:
    """Every launch knob, with its default. See :meth:`omnictl.Pipeline.launch` for each."""

    model_path: str | None = None  # None: the topology's own `model_path`
    device: str | None = None  # "cpu" drops the GPU placement
    request_timeout: float = 300.0  # seconds a request may take before it fails
    ready_timeout: float = 120.0  # seconds every stage process may take to load
    # A streamed input's backpressure: a request's chunks sent that its entry stage's scheduler
    # has not taken yet, at most (RequestHandle.send waits for credit beyond), and how long one
    # send waits before it raises InputStalled.
    input_window: int = 64
    input_wait: float = 30.0
    # how stages that make audio for several streams pick the next: "fifo" or "deadline"
    # (least playback slack first; see omnictl.playback.policy)
    audio_policy: str = DEFAULT_POLICY
    faults: FaultConfig = field(default_factory=FaultConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    def __post_init__(self) -> None:
        for name in ("request_timeout", "ready_timeout", "input_wait"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, not {getattr(self, name)!r}")
        if not (isinstance(self.input_window, int) and self.input_window >= 1):
            raise ValueError(f"input_window must be >= 1 chunk, not {self.input_window!r}")
        check_policy(self.audio_policy)

    @classmethod
    def of(cls, **options: Unpack[LaunchOptions]) -> LaunchConfig:
        """The defaults with ``options`` (flat names, as :meth:`omnictl.Pipeline.launch` takes them)."""
        return cls().replace(**options)

    def replace(self, **changes: Unpack[LaunchOptions]) -> LaunchConfig:
        """A copy with ``changes`` by flat name (``max_restarts=2`` replaces the field of
        ``faults``), checked like a new config. An unknown name raises :class:`TypeError`."""
        own: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name in _PART_OF:
                parts.setdefault(_PART_OF[name], {})[name] = value
            elif name in _PARTS or name not in {f.name for f in dataclasses.fields(self)}:
                raise TypeError(f"LaunchConfig has no knob {name!r}")
            else:
                own[name] = value
        for part, values in parts.items():
            own[part] = dataclasses.replace(getattr(self, part), **values)
        return dataclasses.replace(self, **own)

    def model_path_for(self, topology: Topology) -> str | None:
        """Where the weights are: this config's ``model_path``, else the topology's."""
        return self.model_path if self.model_path is not None else topology.model_path

    @property
    def remote(self) -> bool:
        """Every process is reached over tcp (the Ray launcher)."""
        return self.placement.launcher == "ray"
