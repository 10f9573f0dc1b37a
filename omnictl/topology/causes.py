"""Root causes first: which problems only follow from others.

A typo in a stage name (``unknown-stage``) or a field name (``schema``) also leaves the
misspelt stage without an incoming edge (``entry``, ``unreachable``), or without a route to
a terminal (``dead-end``); a cycle gives its stages an extra upstream (``fan-in-sources``,
whose advice to add a ``wait_for`` would be wrong). Those follow-on problems are found by
fixing each root cause the way its hint suggests (the closest name) and checking the graph
again: whatever disappears follows from that root cause. They are listed after the root
causes, say which one they follow from, and lose their hint.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Any, Callable

from omnictl.topology.issues import Issue
from omnictl.topology.raw import NAME_LISTS
from omnictl.topology.yamlnodes import Document

ROOT_RULES = frozenset(
    {"yaml-syntax", "duplicate-key", "schema", "duplicate-stage", "unknown-stage", "self-reference", "cycle"}
)
# Whole-graph rules whose findings can be consequences of a root cause.
FOLLOW_ON_RULES = frozenset({"entry", "unreachable", "dead-end", "fan-in-sources", "routing-mode", "fan-in-pair"})


def _may_follow(issue: Issue) -> bool:
    """A finding that a root cause can produce. Besides the whole-graph rules: `modality` on a
    stage that is not terminal, which a misspelt `terminal` produces (its hint, "remove
    `modality`", would point the wrong way), though it is reported under ``schema``."""
    return issue.rule in FOLLOW_ON_RULES or (issue.rule == "schema" and "but is not terminal" in issue.message)


GraphCheck = Callable[[Document], list[Issue]]
Fix = Callable[[dict[str, Any]], bool]  # edits a copy of the document's data; False: no fix known


def order_by_cause(doc: Document, issues: list[Issue], stage_fields: list[str], check: GraphCheck) -> list[Issue]:
    """``issues`` with root causes first (in file order), then the rest, then those that
    only follow from a root cause, marked with ``follows_from``."""
    by_line = sorted(issues, key=lambda i: (i.line, i.column))
    candidates = [i for i in by_line if _may_follow(i)]
    roots = [i for i in by_line if i.rule in ROOT_RULES and i not in candidates]
    if not roots or not candidates or not isinstance(doc.data, dict):
        return sorted(by_line, key=lambda i: (i.rule not in ROOT_RULES, i.line, i.column))
    follows: dict[Issue, Issue] = {}
    for root in roots:
        fix = _fix_for(root, doc.data, stage_fields)
        if fix is None:
            continue
        data = copy.deepcopy(doc.data)
        if not fix(data):
            continue
        after = {(i.rule, i.stage) for i in check(dataclasses.replace(doc, data=data, issues=[]))}
        for issue in candidates:
            if issue not in follows and (issue.rule, issue.stage) not in after:
                follows[issue] = root
    for root in roots:  # a cycle: its stages' fan-in and entry findings are its consequences
        if root.rule == "cycle":
            members = set(_cycle_members(root))
            for issue in candidates:
                if issue not in follows and (issue.stage in members or issue.rule == "entry"):
                    follows[issue] = root
    marked = [
        dataclasses.replace(issue, hint=None, follows_from=f"{root.rule} at {root.line}:{root.column}")
        for issue, root in follows.items()
    ]
    rest = [i for i in by_line if i not in follows]
    ordered = sorted(rest, key=lambda i: (i.rule not in ROOT_RULES, i.line, i.column))
    return ordered + sorted(marked, key=lambda i: (i.line, i.column))


def _fix_for(root: Issue, data: dict[str, Any], stage_fields: list[str]) -> Fix | None:
    """The edit the root cause's hint suggests, when there is one to make."""
    if root.rule == "unknown-stage" and root.stage is not None and root.field in NAME_LISTS:
        return lambda copy_: _rename_target(copy_, root.stage or "", root.field or "")
    if root.rule == "schema" and root.stage is not None and root.field is not None and "unknown field" in root.message:
        close = difflib.get_close_matches(root.field, stage_fields, n=1)
        if close:
            return lambda copy_: _rename_field(copy_, root.stage or "", root.field or "", close[0])
    return None


def _stage_entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    stages = data.get("stages")
    return [e for e in stages if isinstance(e, dict)] if isinstance(stages, list) else []


def _rename_target(data: dict[str, Any], stage: str, key: str) -> bool:
    entries = _stage_entries(data)
    names = [str(e.get("name")) for e in entries]
    changed = False
    for entry in entries:
        if entry.get("name") != stage:
            continue
        targets = entry.get(key)
        listed = targets if isinstance(targets, list) else [targets]
        fixed = []
        for target in listed:
            if isinstance(target, str) and target not in names:
                close = difflib.get_close_matches(target, names, n=1)
                target = close[0] if close else None
                changed = True
            if target is not None:
                fixed.append(target)
        entry[key] = fixed if isinstance(targets, list) else (fixed[0] if fixed else None)
    return changed


def _rename_field(data: dict[str, Any], stage: str, wrong: str, right: str) -> bool:
    for entry in _stage_entries(data):
        if entry.get("name") == stage and wrong in entry and right not in entry:
            entry[right] = entry.pop(wrong)
            return True
    return False


def _cycle_members(issue: Issue) -> list[str]:
    """The stages a ``cycle`` message names: "... a cycle: b -> c -> b (also on it: d)"."""
    text = issue.message.split("cycle:", 1)[-1].replace("(also on it:", "->").replace(")", "")
    return [name.strip() for name in text.replace(",", "->").split("->") if name.strip()]
