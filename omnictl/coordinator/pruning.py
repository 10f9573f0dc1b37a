"""Request-scoped pruning: which stages run for a request, given its modalities."""

from __future__ import annotations

from typing import Sequence

from omnictl.exceptions import InvalidRequest
from omnictl.topology.model import Topology
from omnictl.topology.shape import reachable


def select_terminals(topology: Topology, modalities: Sequence[str] | None) -> tuple[str, ...]:
    """Terminals producing the requested modalities (all terminals for ``None``)."""
    if modalities is None:
        return tuple(topology.terminals)
    available = sorted(set(topology.terminals.values()))
    unknown = [mod for mod in modalities if mod not in available]
    if unknown or not modalities:
        raise InvalidRequest(
            f"modalities {list(modalities)!r}: this topology produces {available}",
            field="modalities",
        )
    return tuple(stage for stage, mod in topology.terminals.items() if mod in modalities)


def active_stages(topology: Topology, terminals: Sequence[str]) -> tuple[str, ...]:
    """Stages on some path (data or stream edges) from the entry to one of ``terminals``.

    A stage that leads only to unselected terminals never sees the request.
    """
    downstream: dict[str, list[str]] = {name: [] for name in topology.stages}
    upstream: dict[str, list[str]] = {name: [] for name in topology.stages}
    for edge in topology.edges:  # stream edges count: a stage reached only by stream_to runs too
        downstream[edge.src].append(edge.dst)
        upstream[edge.dst].append(edge.src)
    reaches_terminal = reachable(terminals, upstream)
    from_entry = reachable(
        [topology.entry], {n: [d for d in ds if d in reaches_terminal] for n, ds in downstream.items()}
    )
    return tuple(name for name in topology.stages if name in reaches_terminal and name in from_entry)
