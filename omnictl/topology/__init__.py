"""The topology language: load, validate and derive a stage graph from a YAML file.

The runtime builds on :func:`load`; ``omnictl validate`` is a thin shell over :func:`validate`.
"""

from __future__ import annotations

from omnictl.exceptions import ResolveError, TopologyReadError
from omnictl.topology.derive import on_cpu
from omnictl.topology.imports import resolve, resolve_callable, topology_dir
from omnictl.topology.issues import Issue
from omnictl.topology.model import (
    Edge,
    EdgeKind,
    ProcessSpec,
    RelayKnobs,
    StageSpec,
    Topology,
    Transport,
)
from omnictl.topology.schema import schema_path
from omnictl.topology.validation import (
    ValidationReport,
    load,
    loads,
    validate,
    validate_text,
)

__all__ = [
    "Edge",
    "EdgeKind",
    "Issue",
    "ProcessSpec",
    "RelayKnobs",
    "ResolveError",
    "StageSpec",
    "Topology",
    "TopologyReadError",
    "Transport",
    "ValidationReport",
    "load",
    "loads",
    "on_cpu",
    "resolve",
    "resolve_callable",
    "schema_path",
    "topology_dir",
    "validate",
    "validate_text",
]
