"""The stage list as written, read leniently so graph rules can run beside schema errors.

A field whose value has the wrong shape is left out and named in ``malformed``: the
schema check has already reported it, and the graph rules skip what depends on it
instead of reporting consequences of a typo as extra errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeGuard

from omnictl.topology.issues import Issue
from omnictl.topology.model import Elastic
from omnictl.topology.yamlnodes import Document, Path, Position

NAME_LISTS = ("next", "wait_for", "stream_to")
DOTTED_FIELDS = ("factory", "route_fn", "merge_fn")


@dataclass
class RawStage:
    index: int
    name: str
    path: Path  # ("stages", index)
    factory: str | None = None
    factory_args: dict[str, Any] = field(default_factory=dict)
    next: tuple[str, ...] | None = None  # None: not given
    route_fn: str | None = None
    terminal: bool = False
    modality: str | None = None
    wait_for: tuple[str, ...] | None = None
    merge_fn: str | None = None
    gpu: tuple[int, ...] | None = None
    gpu_is_list: bool = False
    tp_size: int | None = None
    process: str | None = None
    stream_to: tuple[str, ...] | None = None
    project: dict[str, str] = field(default_factory=dict)
    relay: dict[str, int] = field(default_factory=dict)
    given: frozenset[str] = frozenset()  # fields present in the file
    malformed: set[str] = field(default_factory=set)

    @property
    def process_name(self) -> str:
        return self.process or self.name

    @property
    def is_tensor_parallel(self) -> bool:
        return len(self.gpu or ()) > 1 or (self.tp_size or 1) > 1


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _names(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _boolean(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _mapping(value: Any) -> dict[Any, Any] | None:
    return value if isinstance(value, dict) else None


def _tp_size(value: Any) -> int | None:
    return value if _is_int(value) and value >= 1 else None


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    **{key: _names for key in NAME_LISTS},
    **{key: _string for key in (*DOTTED_FIELDS, "modality", "process")},
    "terminal": _boolean,
    "factory_args": _mapping,
    "tp_size": _tp_size,
}


def _read_stage(index: int, entry: dict[Any, Any]) -> RawStage:
    stage = RawStage(
        index=index, name=entry["name"], path=("stages", index), given=frozenset(k for k in entry if isinstance(k, str))
    )
    for key, convert in _CONVERTERS.items():
        if key in entry:
            value = convert(entry[key])
            if value is None:
                stage.malformed.add(key)
            else:
                setattr(stage, key, value)
    if "gpu" in entry:
        gpu = entry["gpu"]
        if _is_int(gpu):
            stage.gpu = (gpu,)
        elif isinstance(gpu, list) and gpu and all(_is_int(g) for g in gpu):
            stage.gpu, stage.gpu_is_list = tuple(gpu), True
        else:
            stage.malformed.add("gpu")
    project = entry.get("project")
    if isinstance(project, dict):
        stage.project = {k: v for k, v in project.items() if isinstance(k, str) and isinstance(v, str)}
    elif "project" in entry:
        stage.malformed.add("project")
    relay = entry.get("relay")
    if isinstance(relay, dict):
        stage.relay = {
            k: v for k, v in relay.items() if k in ("slot_bytes", "slots", "inline_bytes", "inbox") and _is_int(v)
        }
    return stage


@dataclass
class RawProcess:
    """One entry of the top-level `processes` mapping; knobs of the wrong shape are left at
    their defaults (the schema check reported them)."""

    name: str
    path: Path  # ("processes", name)
    replicas: int = 1
    node: str | None = None
    cpus: float = 1.0
    elastic: Elastic | None = None
    min_over_max: bool = False  # `replicas: {min, max}` with min > max (a rule reports it)
    node_labels: tuple[str, ...] = ()  # `node` written as a list (rule tp-node refuses several)


def _read_elastic(process: RawProcess, replicas: dict[Any, Any]) -> None:
    low, high = replicas.get("min"), replicas.get("max")
    if not (_is_int(low) and _is_int(high) and low >= 1 and high >= 1):
        return  # the schema check reported it
    if low > high:
        process.min_over_max = True
        return
    triggers: dict[str, float] = {}
    for key in ("queue", "window", "idle"):
        value = replicas.get(key)
        if (_is_int(value) or isinstance(value, float)) and value > 0:
            triggers[key] = float(value)
    process.replicas, process.elastic = high, Elastic(low, **triggers)


def read_processes(doc: Document) -> dict[str, RawProcess]:
    """The `processes` entries whose key is a string, in file order."""
    entries = doc.data.get("processes") if isinstance(doc.data, dict) else None
    if not isinstance(entries, dict):
        return {}
    processes: dict[str, RawProcess] = {}
    for name, knobs in entries.items():
        if not isinstance(name, str):
            continue
        process = processes[name] = RawProcess(name, ("processes", name))
        if not isinstance(knobs, dict):
            continue
        replicas, node, cpus = knobs.get("replicas"), knobs.get("node"), knobs.get("cpus")
        if _is_int(replicas) and replicas >= 1:
            process.replicas = replicas
        elif isinstance(replicas, dict):
            _read_elastic(process, replicas)
        if isinstance(node, str):
            process.node = node
        elif isinstance(node, list) and node and all(isinstance(n, str) for n in node):
            process.node, process.node_labels = node[0], tuple(node)
        if (_is_int(cpus) or isinstance(cpus, float)) and cpus > 0:
            process.cpus = float(cpus)
    return processes


def read_stages(doc: Document) -> list[RawStage]:
    """Every stage entry that is a mapping with a string name, in file order."""
    stages = doc.data.get("stages") if isinstance(doc.data, dict) else None
    if not isinstance(stages, list):
        return []
    return [
        _read_stage(i, entry)
        for i, entry in enumerate(stages)
        if isinstance(entry, dict) and isinstance(entry.get("name"), str)
    ]


class Reporter:
    """Collects issues for one document, placing each at the node it is about."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: list[Issue] = []

    def add(
        self,
        rule: str,
        message: str,
        *,
        stage: RawStage | None = None,
        field: str | None = None,
        at: Path = (),
        key: bool = False,
        hint: str | None = None,
    ) -> None:
        """``at`` is relative to the stage (or to the root without one); ``key`` points at the
        key of ``at`` rather than its value."""
        path = (stage.path if stage else ()) + at
        line, column = self.doc.key_position(path) if key else self.doc.position(path)
        self.issues.append(
            Issue(
                rule, message, self.doc.file, line, column, stage=stage.name if stage else None, field=field, hint=hint
            )
        )

    def position(self, path: Path) -> Position:
        return self.doc.position(path)
