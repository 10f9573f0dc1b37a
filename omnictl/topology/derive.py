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
    ProcessSpec,
    StageSpec,
    Topology,
    Transport,
)


def transport_between(src: StageSpec, dst: StageSpec) -> Transport:
    """The transport placement implies; never configured."""
    if src.process == dst.process:
        return Transport.INPROC
    if not src.gpu or not dst.gpu:
        return Transport.SHM
    if src.gpu[0] == dst.gpu[0]:  # tensor-parallel groups talk through rank 0
        return Transport.CUDA_IPC
    return Transport.RELAY


def derive_edges(stages: Mapping[str, StageSpec]) -> tuple[Edge, ...]:
    edges: list[Edge] = []
    for spec in stages.values():
        for kind, targets in ((EdgeKind.DATA, spec.next), (EdgeKind.STREAM, spec.stream_to)):
            for target in targets:
                edges.append(Edge(spec.name, target, kind, transport_between(spec, stages[target])))
    return tuple(edges)


def derive_processes(stages: Mapping[str, StageSpec],
                     replicas: Mapping[str, int] | None = None) -> dict[str, ProcessSpec]:
    """``replicas``: the `processes` knobs, by process name (absent: one replica)."""
    members: dict[str, list[str]] = {}
    gpus: dict[str, list[int]] = {}
    for spec in stages.values():
        members.setdefault(spec.process, []).append(spec.name)
        for gpu in spec.gpu:
            if gpu not in gpus.setdefault(spec.process, []):
                gpus[spec.process].append(gpu)
    return {
        name: ProcessSpec(name, tuple(names), tuple(gpus.get(name, ())), (replicas or {}).get(name, 1))
        for name, names in members.items()
    }


def derive(
    name: str,
    path: Path | None,
    model_path: str | None,
    stages: Mapping[str, StageSpec],
    replicas: Mapping[str, int] | None = None,
    allow_pickle: bool = False,
) -> Topology:
    edges = derive_edges(stages)
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
        processes=derive_processes(stages, replicas),
        edges=edges,
        allow_pickle=allow_pickle,
    )


def on_cpu(topology: Topology) -> Topology:
    """The same topology with every GPU placement dropped and transports derived again.

    Processes (and their replicas) stay as declared, so a two-GPU topology runs on a CPU-only machine
    with the same process layout (its cross-process edges become ``shm``).
    """
    stages = {n: dataclasses.replace(s, gpu=(), tp_size=1) for n, s in topology.stages.items()}
    replicas = {name: p.replicas for name, p in topology.processes.items()}
    return derive(topology.name, topology.path, topology.model_path, stages, replicas, topology.allow_pickle)
