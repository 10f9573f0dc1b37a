"""Validate a topology file and derive the Topology from it: the library API behind
``omnictl validate`` and the runtime's ``load``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnictl.exceptions import TopologyError, TopologyReadError
from omnictl.topology import placement, rules, shape
from omnictl.topology.causes import order_by_cause
from omnictl.topology.derive import derive, on_cpu
from omnictl.topology.imports import check_imports as check_stage_imports
from omnictl.topology.imports import import_path, topology_dir
from omnictl.topology.issues import Issue
from omnictl.topology.model import ProcessKnobs, RelayKnobs, StageSpec, Topology
from omnictl.topology.raw import RawStage, Reporter, read_processes, read_stages
from omnictl.topology.schema import check_schema, load_schema
from omnictl.topology.yamlnodes import Document, parse

__all__ = ["TopologyReadError", "ValidationReport", "load", "loads", "validate", "validate_text"]


@dataclass
class ValidationReport:
    file: str
    issues: list[Issue] = field(default_factory=list)
    topology: Topology | None = None

    @property
    def valid(self) -> bool:
        return not self.issues

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "valid": self.valid,
            "errors": [issue.to_json() for issue in self.issues],
            "derived": derived_json(self.topology) if self.topology is not None else None,
        }


def derived_json(topology: Topology) -> dict[str, Any]:
    """What omnictl derived, in the shape of ``omnictl validate --format json``."""
    return {
        "entry": topology.entry,
        "terminals": dict(topology.terminals),
        "processes": {
            name: {
                "stages": list(p.stages),
                "gpus": list(p.gpus),
                "replicas": p.replicas,
                "instances": list(p.instances),
                "node": p.node,
                "cpus": p.cpus,
                # `replicas: {min, max}`: the autoscaler's bounds and triggers (None: fixed)
                "elastic": dataclasses.asdict(p.elastic) if p.elastic is not None else None,
            }
            for name, p in topology.processes.items()
        },
        "tensor_parallel": {
            spec.name: {
                "process": spec.process,
                "tp_size": spec.tp_size,
                "ranks": [spec.rank_device(rank) for rank in range(spec.tp_size)],
            }
            for spec in topology.tensor_parallel()
        },
        # transport_on_cpu: what `serve --device cpu` uses instead (its GPU placement dropped).
        "edges": [
            {
                "from": e.src,
                "to": e.dst,
                "kind": e.kind.value,
                "transport": e.transport.value,
                "transport_on_cpu": cpu.transport.value,
            }
            for e, cpu in zip(topology.edges, on_cpu(topology).edges)
        ],
    }


def _stage_spec(stage: RawStage, line: int) -> StageSpec:
    gpu = stage.gpu or ()
    return StageSpec(
        name=stage.name,
        factory=stage.factory or "",
        factory_args=dict(stage.factory_args),
        next=stage.next or (),
        route_fn=stage.route_fn,
        terminal=stage.terminal,
        modality=(stage.modality or stage.name) if stage.terminal else None,
        wait_for=stage.wait_for or (),
        merge_fn=stage.merge_fn,
        gpu=gpu,
        tp_size=stage.tp_size or max(len(gpu), 1),
        process=stage.process_name,
        stream_to=stage.stream_to or (),
        project=dict(stage.project),
        relay=RelayKnobs(**stage.relay),
        line=line,
    )


def _graph_issues(
    doc: Document, stages: list[RawStage], check_imports: bool, find_imports: bool = False
) -> list[Issue]:
    report = Reporter(doc)
    by_name = rules.unique_stages(stages, report)
    names = list(by_name)
    upstreams = rules.upstreams_of(by_name)
    for stage in stages:
        rules.check_routing(stage, report)
        rules.check_references(stage, names, report)
        placement.check_tp_size(stage, report)
    if check_imports or find_imports:
        directory = topology_dir(doc.file)  # the same rule as the stage processes use
        with import_path(directory):
            for stage in stages:
                check_stage_imports(stage, report, directory, static=not check_imports)
    for name, stage in by_name.items():
        rules.check_fan_in(stage, upstreams[name], names, report)
    shape.check_entry_and_reach(by_name, report)
    entries = doc.data.get("stages") if isinstance(doc.data, dict) else None
    terminal_written = isinstance(entries, list) and any(
        isinstance(e, dict) and e.get("terminal") is True for e in entries
    )
    shape.check_terminals(by_name, report, terminal_written)
    shape.check_cycles(by_name, report)
    placement.check_processes(by_name, report)
    placement.check_declared_processes(read_processes(doc), stages, report)
    placement.check_group_nodes(read_processes(doc), by_name, report)
    return report.issues


def validate_text(
    text: str, filename: str = "<string>", *, check_imports: bool = False, find_imports: bool = False
) -> ValidationReport:
    """Every problem in ``text``; the derived Topology when there is none. Never raises.

    ``check_imports`` imports every dotted path the stages name; ``find_imports`` only finds
    them (their modules' files and top-level names, see ``find_callable``), which a launch
    does before it starts any process."""
    doc = parse(text, filename)
    issues = list(doc.issues)
    if not any(i.rule == "yaml-syntax" for i in issues):
        issues += check_schema(doc)
        stages = read_stages(doc)
        if isinstance(doc.data, dict) and isinstance(doc.data.get("stages"), list):
            issues += _graph_issues(doc, stages, check_imports, find_imports)  # else: the schema said why
    stage_fields = list(load_schema()["$defs"]["stage"]["properties"])
    issues = order_by_cause(doc, issues, stage_fields, lambda d: _graph_issues(d, read_stages(d), False))
    report = ValidationReport(file=filename, issues=issues)
    if report.valid:
        data = doc.data
        stage_specs = {s.name: _stage_spec(s, doc.position(s.path)[0]) for s in stages}
        path = None if filename.startswith("<") else Path(filename)
        name = data.get("name") or (path.stem if path else "topology")
        knobs = {n: ProcessKnobs(p.replicas, p.node, p.cpus, p.elastic) for n, p in read_processes(doc).items()}
        report.topology = derive(
            name, path, data.get("model_path"), stage_specs, knobs, allow_pickle=data.get("allow_pickle") is True
        )
    return report


MAX_TOPOLOGY_BYTES = 1024 * 1024  # the largest shipped topology is ~5 KB


def read_text(path: str | Path) -> str:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_TOPOLOGY_BYTES + 1)
        if len(raw) > MAX_TOPOLOGY_BYTES:
            raise TopologyReadError(
                str(path), f"the file is larger than {MAX_TOPOLOGY_BYTES // 1024} KiB; a topology is a few KB"
            )
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TopologyReadError(str(path), str(error)) from error


def validate(path: str | Path, *, check_imports: bool = False) -> ValidationReport:
    """Validate one file. Raises :class:`TopologyReadError` if it cannot be read."""
    return validate_text(read_text(path), str(path), check_imports=check_imports)


def loads(text: str, filename: str = "<string>", *, find_imports: bool = False) -> Topology:
    """The Topology described by ``text``; raises TopologyError listing every problem."""
    report = validate_text(text, filename, find_imports=find_imports)
    if report.topology is None:
        raise TopologyError(filename, report.issues)
    return report.topology


def load(path: str | Path, *, device: str | None = None, find_imports: bool = False) -> Topology:
    """The Topology in ``path``. ``device="cpu"`` drops every GPU placement (see on_cpu).
    ``find_imports``: also report a factory, route_fn, merge_fn or projection that certainly
    does not exist (rule ``import``, at its field's line) without importing it."""
    topology = loads(read_text(path), str(path), find_imports=find_imports)
    if device is None:
        return topology
    if device == "cpu":
        return on_cpu(topology)
    raise ValueError(f"device must be None or 'cpu', not {device!r}")
