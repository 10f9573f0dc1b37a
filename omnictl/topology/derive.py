"""Derive entry, terminals, processes and edge transports from the stage list.

Assumes the stage list passed the graph rules (exactly one entry, references exist).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping

from omnictl.topology.model import (
    Edge,
    EdgeKind,
    ProcessKnobs,
    ProcessSpec,
    StageSpec,
    Topology,
    Transport,
)
from omnictl.transports import registry
from omnictl.transports.registry import Placement


def transport_between(
    src: StageSpec, dst: StageSpec, src_node: str | None = None, dst_node: str | None = None
) -> Transport:
    """The transport placement implies (the registered transports decide, see
    :mod:`omnictl.transports.registry`); never configured. ``*_node``: the processes' `node`
    labels (None: the coordinator's machine)."""
    return registry.select(Placement(src.process == dst.process, src_node, dst_node, tuple(src.gpu), tuple(dst.gpu)))


def derive_edges(stages: Mapping[str, StageSpec], knobs: Mapping[str, ProcessKnobs] | None = None) -> tuple[Edge, ...]:
    nodes = {name: k.node for name, k in (knobs or {}).items()}
    edges: list[Edge] = []
    for spec in stages.values():
        for kind, targets in ((EdgeKind.DATA, spec.next), (EdgeKind.STREAM, spec.stream_to)):
            for target in targets:
                dst = stages[target]
                transport = transport_between(spec, dst, nodes.get(spec.process), nodes.get(dst.process))
                edges.append(Edge(spec.name, target, kind, transport))
    return tuple(edges)


def derive_processes(
    stages: Mapping[str, StageSpec], knobs: Mapping[str, ProcessKnobs] | None = None
) -> dict[str, ProcessSpec]:
    """``knobs``: the `processes` entries, by process name (absent: defaults)."""
    members: dict[str, list[str]] = {}
    gpus: dict[str, list[int]] = {}
    for spec in stages.values():
        members.setdefault(spec.process, []).append(spec.name)
        for gpu in spec.gpu:
            if gpu not in gpus.setdefault(spec.process, []):
                gpus[spec.process].append(gpu)
    declared = knobs or {}
    specs: dict[str, ProcessSpec] = {}
    for name, names in members.items():
        k = declared.get(name, ProcessKnobs())
        specs[name] = ProcessSpec(name, tuple(names), tuple(gpus.get(name, ())), k.replicas, k.node, k.cpus, k.elastic)
    return specs


def derive(
    name: str,
    path: Path | None,
    model_path: str | None,
    stages: Mapping[str, StageSpec],
    knobs: Mapping[str, ProcessKnobs] | None = None,
    allow_pickle: bool = False,
) -> Topology:
    edges = derive_edges(stages, knobs)
    targets = {e.dst for e in edges}
    entries = [n for n in stages if n not in targets]
    terminals = {n: (s.modality or n) for n, s in stages.items() if s.terminal}
    return Topology(
        name=name,
        path=path,
        model_path=model_path,
        stages=dict(stages),
        entry=entries[0],
        terminals=terminals,
        processes=derive_processes(stages, knobs),
        edges=edges,
        allow_pickle=allow_pickle,
    )


def on_cpu(topology: Topology) -> Topology:
    """The same topology with every GPU placement dropped and transports derived again.

    Processes (their replicas and nodes) stay as declared, so a two-GPU topology runs on a CPU-only machine
    with the same process layout (its cross-process edges become ``shm``). A tensor-parallel
    stage keeps its ``tp_size``: its ranks run on the CPU (gloo) instead of its GPUs.
    """
    stages = {n: dataclasses.replace(s, gpu=()) for n, s in topology.stages.items()}
    return derive(topology.name, topology.path, topology.model_path, stages, knobs_of(topology), topology.allow_pickle)


def knobs_of(topology: Topology) -> dict[str, ProcessKnobs]:
    """The `processes` knobs the topology was derived with."""
    return {name: ProcessKnobs(p.replicas, p.node, p.cpus, p.elastic) for name, p in topology.processes.items()}
