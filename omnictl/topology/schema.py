"""The JSON Schema check, with each schema error mapped to the line of the node at fault."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path as FilePath
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from omnictl.data import SCHEMA, data_path
from omnictl.topology.issues import Issue
from omnictl.topology.yamlnodes import Document, Path

# What each field expects, in words: used as the message for shape errors and as the hint.
FIELD_EXPECTS: dict[str, str] = {
    "name": "a name made of letters, digits, '_' and '-' (starting with a letter or '_')",
    "model_path": "a non-empty string",
    "allow_pickle": "true or false",
    "stages": "a list of stages, each a mapping with at least `name` and `factory`",
    "factory": "a dotted path to a callable, like package.module.function",
    "factory_args": "a mapping of keyword arguments for the factory",
    "next": "a stage name or a list of distinct stage names",
    "route_fn": "a dotted path to a callable, like package.module.function",
    "terminal": "true or false",
    "modality": "an output modality name such as text or audio",
    "wait_for": "a stage name or a list of distinct stage names",
    "merge_fn": "a dotted path to a callable, like package.module.function",
    "gpu": "a GPU id (integer), or a list of GPU ids for tensor parallel",
    "tp_size": "an integer of at least 1 (ranks; equal to the length of the `gpu` list when there is one)",
    "process": "a process name made of letters, digits, '_' and '-'",
    "stream_to": "a stage name or a list of distinct stage names",
    "project": "a mapping from target stage name to the dotted path of a projection function",
    "relay": "a mapping of transport knobs: slot_bytes, slots, inline_bytes, inbox",
    "slot_bytes": "an integer number of bytes, at least 1",
    "slots": "an integer slot count, at least 1",
    "inline_bytes": "an integer number of bytes, at least 0",
    "inbox": "an integer number of queued requests, at least 1",
    "processes": "a mapping from process name to its knobs, like `tts: {replicas: 2}`",
    "replicas": "an integer number of replicas, at least 1, or `{min: N, max: M}` (1 <= N <= M; optional `queue`, "
    "`window`, `idle`: numbers greater than 0)",
    "node": "a node label made of letters, digits, '_' and '-' (one per process)",
    "cpus": "a number of CPUs greater than 0",
}

_TRANSPORT_HINT = (
    "transports are derived from placement, never configured (same process: inproc; "
    "same GPU: cuda_ipc; CPU on either side: shm; different GPUs: relay; different `node` labels: tcp); remove this key "
    "and set `process`/`gpu` instead"
)


def schema_path() -> FilePath:
    """The schema file: the package data (``schemas/`` in a checkout holds a copy of it)."""
    return data_path(SCHEMA)


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    with open(schema_path(), encoding="utf-8") as handle:
        schema: dict[str, Any] = json.load(handle)
    return schema


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema())


def _stage_of(data: Any, path: Path) -> str | None:
    if len(path) >= 2 and path[0] == "stages" and isinstance(path[1], int):
        stages = data.get("stages") if isinstance(data, dict) else None
        if isinstance(stages, list) and path[1] < len(stages) and isinstance(stages[path[1]], dict):
            name = stages[path[1]].get("name")
            return name if isinstance(name, str) else None
    return None


def _in_process(path: Path) -> bool:
    """``path`` is inside one entry of the top-level `processes` mapping."""
    return len(path) >= 2 and path[0] == "processes" and isinstance(path[1], str)


def _field_of(path: Path) -> str | None:
    rest = path[2:] if len(path) >= 2 and path[0] == "stages" and isinstance(path[1], int) else path
    if _in_process(path):
        rest = path[2:] or path[:1]  # a knob, or the process entry itself
    for part in rest:
        if isinstance(part, str):
            return part
    return None


def _where(stage: str | None, path: Path) -> str:
    if stage is not None:
        return f"stage {stage!r}: "
    if len(path) >= 2 and path[0] == "stages" and isinstance(path[1], int):
        return f"stages[{path[1]}]: "
    if _in_process(path):
        return f"process {path[1]!r}: "
    return ""


def _unknown_fields(doc: Document, error: ValidationError, path: Path) -> list[Issue]:
    known = sorted(error.schema.get("properties", {}))
    stage = _stage_of(doc.data, path)
    issues = []
    for extra in sorted(set(error.instance) - set(known), key=str):
        line, column = doc.key_position(path + (extra,))
        if path and path[-1] == "relay" and extra == "transport":
            hint = _TRANSPORT_HINT
        else:
            close = difflib.get_close_matches(str(extra), known, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            hint += "known fields: " + ", ".join(known)
        where = _where(stage, path)
        entry = path and isinstance(path[-1], str) and not (_in_process(path) and len(path) == 2)
        owner = f" in `{path[-1]}`" if entry else ""
        issues.append(
            Issue(
                "schema",
                f"{where}unknown field `{extra}`{owner}",
                doc.file,
                line,
                column,
                stage=stage,
                field=str(extra),
                hint=hint,
            )
        )
    return issues


def _issue_for(doc: Document, error: ValidationError) -> list[Issue]:
    path: Path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        return _unknown_fields(doc, error, path)
    stage = _stage_of(doc.data, path)
    field = _field_of(path)
    where = _where(stage, path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        line, column = doc.position(path)
        return [
            Issue(
                "schema",
                f"{where}missing required field `{missing}`",
                doc.file,
                line,
                column,
                stage=stage,
                field=missing,
                hint=FIELD_EXPECTS.get(missing),
            )
        ]
    line, column = doc.position(path)
    if not path and error.validator == "type":
        kind = type(error.instance).__name__
        return [
            Issue(
                "schema",
                f"a topology must be a mapping with a `stages` list, not a {kind}",
                doc.file,
                line,
                column,
                hint="start the file with `stages:`",
            )
        ]
    if len(path) == 2 and path[0] == "stages" and error.validator == "type":
        return [
            Issue(
                "schema",
                f"stages[{path[1]}]: a stage must be a mapping with at least "
                f"`name` and `factory` (got {error.instance!r})",
                doc.file,
                line,
                column,
                hint="write a stage as `- name: ...` followed by its fields",
            )
        ]
    expects = FIELD_EXPECTS.get(field or "")
    if error.validator in ("type", "anyOf", "pattern") and expects:
        label = f"`{field}`" if field else "value"
        message = f"{where}{label} must be {expects} (got {error.instance!r})"
        hint = None
    else:
        label = f"`{field}`: " if field else ""
        message = f"{where}{label}{error.message}"
        hint = expects
    return [Issue("schema", message, doc.file, line, column, stage=stage, field=field, hint=hint)]


def check_schema(doc: Document) -> list[Issue]:
    """Every schema violation in the document, each at its node's line."""
    if doc.data is None:
        return [
            Issue(
                "schema", "the topology is empty", doc.file, 1, 1, hint="a topology is a mapping with a `stages` list"
            )
        ]
    issues: list[Issue] = []
    for error in _validator().iter_errors(doc.data):
        issues.extend(_issue_for(doc, error))
    return issues
