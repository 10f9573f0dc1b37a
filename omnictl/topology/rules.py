"""Graph rules over the stage list: names, routing modes, references, fan-in and shape.

Each rule reports with a stable id (see the README's rule table) and every problem is
reported, not only the first. Rules that depend on a malformed field skip it: the schema
check already named that field.
"""

from __future__ import annotations

import difflib

from omnictl.topology.raw import NAME_LISTS, RawStage, Reporter


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def unique_stages(stages: list[RawStage], report: Reporter) -> dict[str, RawStage]:
    """Stages by name (the first definition wins); ``duplicate-stage`` for the others."""
    by_name: dict[str, RawStage] = {}
    for stage in stages:
        first = by_name.get(stage.name)
        if first is None:
            by_name[stage.name] = stage
            continue
        line = report.position(first.path)[0]
        report.add(
            "duplicate-stage",
            f"stage name {stage.name!r} is already used at line {line}",
            stage=stage,
            field="name",
            at=("name",),
            hint="stage names are ids: rename one of the two stages",
        )
    return by_name


def check_routing(stage: RawStage, report: Reporter) -> None:
    """``routing-mode`` and ``route-candidates``, plus `modality` on non-terminals."""
    if {"next", "route_fn", "terminal"} & stage.malformed:
        return
    routes = [f"`{key}`" for key in ("next", "route_fn") if getattr(stage, key) is not None]
    if stage.terminal and routes:
        report.add(
            "routing-mode",
            f"stage {stage.name!r} is terminal and also has {' and '.join(routes)}",
            stage=stage,
            field="terminal",
            at=("terminal",),
            key=True,
            hint="a terminal returns its results to the coordinator; remove `terminal` or the routing fields",
        )
    elif not stage.terminal and not routes:
        report.add(
            "routing-mode",
            f"stage {stage.name!r} has no routing mode",
            stage=stage,
            hint="give it exactly one: `next` (static), `route_fn` with its candidates "
            "in `next` (dynamic), or `terminal: true`",
        )
    if stage.route_fn is not None and stage.next is None and not stage.terminal:
        report.add(
            "route-candidates",
            f"stage {stage.name!r} has `route_fn` but no `next` listing the stages it may route to",
            stage=stage,
            field="route_fn",
            at=("route_fn",),
            key=True,
            hint="add `next: [...]` with every stage the route_fn may return",
        )
    if stage.stream_to is not None and stage.next is None and stage.route_fn is None:
        report.add(
            "routing-mode",
            f"stage {stage.name!r} has `stream_to` but no `next`",
            stage=stage,
            field="stream_to",
            at=("stream_to",),
            key=True,
            hint="`stream_to` sends increments beside `next`, never instead of it",
        )
    if stage.modality is not None and not stage.terminal and "terminal" not in stage.malformed:
        report.add(
            "schema",
            f"stage {stage.name!r} has `modality` but is not terminal",
            stage=stage,
            field="modality",
            at=("modality",),
            key=True,
            hint="`modality` names what a terminal stage outputs; remove it here",
        )


def check_references(stage: RawStage, names: list[str], report: Reporter) -> None:
    """``unknown-stage`` and ``self-reference`` for next / wait_for / stream_to / project."""
    for key in NAME_LISTS:
        for index, target in enumerate(getattr(stage, key) or ()):
            at = (key, index)  # a single name has no index: the position falls back to the key
            if target == stage.name:
                report.add(
                    "self-reference",
                    f"stage {stage.name!r} names itself in `{key}`",
                    stage=stage,
                    field=key,
                    at=at,
                    hint="a stage cannot send to or wait for itself",
                )
            elif target not in names:
                report.add(
                    "unknown-stage",
                    f"`{key}` of stage {stage.name!r} names {target!r}, which is not a stage",
                    stage=stage,
                    field=key,
                    at=at,
                    hint=_suggest(target, names) + "stages: " + ", ".join(names),
                )
    for target in stage.project:
        if target not in names:
            report.add(
                "unknown-stage",
                f"`project` of stage {stage.name!r} names {target!r}, which is not a stage",
                stage=stage,
                field="project",
                at=("project", target),
                key=True,
                hint=_suggest(target, names) + "stages: " + ", ".join(names),
            )


def upstreams_of(by_name: dict[str, RawStage]) -> dict[str, list[str]]:
    """For each stage, the stages whose `next` lists it, in file order."""
    ups: dict[str, list[str]] = {name: [] for name in by_name}
    for stage in by_name.values():
        for target in stage.next or ():
            if target in ups and target != stage.name and stage.name not in ups[target]:
                ups[target].append(stage.name)
    return ups


def check_fan_in(stage: RawStage, upstreams: list[str], names: list[str], report: Reporter) -> None:
    """``fan-in-pair`` and ``fan-in-sources``."""
    if {"wait_for", "merge_fn"} & stage.malformed:
        return
    if stage.wait_for is not None and stage.merge_fn is None:
        report.add(
            "fan-in-pair",
            f"stage {stage.name!r} has `wait_for` but no `merge_fn`",
            stage=stage,
            field="wait_for",
            at=("wait_for",),
            key=True,
            hint="add `merge_fn:` with the function that merges the arrived inputs",
        )
    if stage.merge_fn is not None and stage.wait_for is None:
        report.add(
            "fan-in-pair",
            f"stage {stage.name!r} has `merge_fn` but no `wait_for`",
            stage=stage,
            field="merge_fn",
            at=("merge_fn",),
            key=True,
            hint="add `wait_for:` listing the upstream stages to merge, or remove `merge_fn`",
        )
    if stage.wait_for is None:
        if len(upstreams) > 1:
            report.add(
                "fan-in-sources",
                f"stage {stage.name!r} receives from {', '.join(upstreams)} but has no `wait_for`",
                stage=stage,
                hint=f"add `wait_for: [{', '.join(upstreams)}]` and a `merge_fn`",
            )
        return
    listed = [n for n in stage.wait_for if n in names and n != stage.name]
    missing = [n for n in upstreams if n not in stage.wait_for]
    extra = [n for n in listed if n not in upstreams]
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"extra {', '.join(extra)} (not an upstream)"] if extra else []
        )
        report.add(
            "fan-in-sources",
            f"`wait_for` of stage {stage.name!r} does not match its upstreams: {'; '.join(parts)}",
            stage=stage,
            field="wait_for",
            at=("wait_for",),
            key=True,
            hint=f"its upstreams (stages whose `next` lists it) are: {', '.join(upstreams) or 'none'}",
        )
