"""The validated, derived topology: what the runtime builds on.

Everything here is derived from the YAML ``stages`` list; nothing is declared twice.
Instances are produced by :func:`omnictl.topology.load` and are immutable. This module
imports nothing from the rest of the package but the transports' kinds
(:mod:`omnictl.transports.kinds`): ``derive`` builds on it, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

# The edge transports' kinds and tuning are the transports' vocabulary; the topology names
# them (these re-exports keep `from omnictl.topology.model import Transport` working).
from omnictl.transports.kinds import RelayKnobs as RelayKnobs
from omnictl.transports.kinds import Transport as Transport
from omnictl.transports.kinds import WireLayout


class EdgeKind(str, Enum):
    DATA = "data"  # results, via `next` (or `route_fn` candidates)
    STREAM = "stream"  # increments while generating, via `stream_to`


@dataclass(frozen=True)
class StageSpec:
    name: str
    factory: str
    factory_args: Mapping[str, Any] = field(default_factory=dict)
    next: tuple[str, ...] = ()
    route_fn: str | None = None
    terminal: bool = False
    modality: str | None = None  # terminals only: resolved (defaults to the stage name)
    wait_for: tuple[str, ...] = ()
    merge_fn: str | None = None
    gpu: tuple[int, ...] = ()  # empty: CPU stage
    tp_size: int = 1
    process: str = ""  # resolved: defaults to the stage name
    stream_to: tuple[str, ...] = ()
    project: Mapping[str, str] = field(default_factory=dict)  # target stage -> dotted path
    relay: RelayKnobs = field(default_factory=RelayKnobs)
    line: int = 0  # where the stage starts in its file (for runtime error messages)

    @property
    def device(self) -> str:
        """``cpu`` or ``cuda:N`` (rank 0's GPU for tensor-parallel stages)."""
        return f"cuda:{self.gpu[0]}" if self.gpu else "cpu"

    def rank_device(self, rank: int) -> str:
        """Where rank ``rank`` of this stage's tensor-parallel group runs: its GPU, or the CPU."""
        return f"cuda:{self.gpu[rank]}" if self.gpu else "cpu"


def replica_name(process: str, index: int, replicas: int) -> str:
    """The OS process name of one replica: ``tts#1``; an unreplicated process keeps its name."""
    return f"{process}#{index}" if replicas > 1 else process


@dataclass(frozen=True)
class Elastic:
    """`replicas: {min, max, queue, window, idle}`: the autoscaler's bounds and triggers (the
    process's ``replicas`` is ``max``)."""

    min: int
    queue: float = 4.0  # requests in flight per running replica above which it adds one
    window: float = 0.5  # seconds the queue must stay above `queue` before a replica is added (forked starts are quick)
    idle: float = 10.0  # seconds at or below half of `queue` before a replica is drained and removed


@dataclass(frozen=True)
class ProcessKnobs:
    """One entry of the top-level `processes` mapping, as declared."""

    replicas: int = 1
    node: str | None = None
    cpus: float = 1.0
    elastic: Elastic | None = None  # None: `replicas` is a fixed count


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    stages: tuple[str, ...]
    gpus: tuple[int, ...]
    replicas: int = 1  # copies, each its own OS process (`processes: {NAME: {replicas: N}}`)
    node: str | None = None  # `node` label: same label, same machine; None: the coordinator's
    cpus: float = 1.0  # CPUs a cluster launcher reserves for each replica
    elastic: Elastic | None = None  # None: all `replicas` run; else between elastic.min and `replicas`

    @property
    def initial(self) -> int:
        """How many replicas start with the pipeline."""
        return self.elastic.min if self.elastic is not None else self.replicas

    @cached_property  # read for every request (replica placement): computed once
    def instances(self) -> tuple[str, ...]:
        """The OS process name of every replica, in replica order."""
        return tuple(replica_name(self.name, i, self.replicas) for i in range(self.replicas))


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    kind: EdgeKind
    transport: Transport


@dataclass(frozen=True)
class Topology:
    name: str
    path: Path | None
    model_path: str | None
    stages: Mapping[str, StageSpec]  # in file order
    entry: str
    terminals: Mapping[str, str]  # terminal stage -> modality
    processes: Mapping[str, ProcessSpec]
    edges: tuple[Edge, ...]
    # Payloads between processes may carry any Python object, pickled (trusted hosts only).
    allow_pickle: bool = False

    def upstreams(self, stage: str) -> tuple[str, ...]:
        """Stages whose data edges (``next``) lead to ``stage``, in file order."""
        return tuple(e.src for e in self.edges if e.dst == stage and e.kind is EdgeKind.DATA)

    def stream_sources(self, stage: str) -> tuple[str, ...]:
        return tuple(e.src for e in self.edges if e.dst == stage and e.kind is EdgeKind.STREAM)

    def edge(self, src: str, dst: str, kind: EdgeKind = EdgeKind.DATA) -> Edge:
        for e in self.edges:
            if e.src == src and e.dst == dst and e.kind is kind:
                return e
        raise KeyError(f"no {kind.value} edge {src} -> {dst}")

    def process_of(self, stage: str) -> str:
        return self.stages[stage].process

    def instances(self) -> tuple[str, ...]:
        """Every OS process the topology runs: each replica of each process."""
        return tuple(name for p in self.processes.values() for name in p.instances)

    def node_of(self, stage: str) -> str | None:
        """The `node` label of the process ``stage`` runs in (None: the coordinator's node)."""
        return self.processes[self.stages[stage].process].node

    def nodes(self) -> tuple[str | None, ...]:
        """Every node label in use, in process order (None: the coordinator's node)."""
        return tuple(dict.fromkeys(p.node for p in self.processes.values()))

    def multi_node(self) -> bool:
        """Some process runs on a node other than the coordinator's: addresses must be TCP."""
        return any(p.node is not None for p in self.processes.values())

    def wire_layout(self) -> WireLayout:
        """What a process's :class:`~omnictl.transports.endpoint.Endpoint` reads of this topology."""
        return WireLayout(
            nodes={name: p.node for p in self.processes.values() for name in p.instances},
            relays={name: stage.relay for name, stage in self.stages.items()},
            allow_pickle=self.allow_pickle,
        )

    def tensor_parallel(self) -> tuple[StageSpec, ...]:
        """Tensor-parallel stages (``tp_size`` > 1: on a GPU list, or N CPU ranks), in file order."""
        return tuple(s for s in self.stages.values() if s.tp_size > 1)
