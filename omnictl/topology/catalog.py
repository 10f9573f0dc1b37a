"""Every rule id ``omnictl validate`` reports, what it means, and a topology that breaks it.

The one list of rule ids: the docs' rule table is generated from it (with the message each
example actually produces, so the table cannot drift from the validator), and a test checks
that every id the validator can report is listed here and that each example still breaks
its rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    meaning: str
    example: str  # a small topology that breaks this rule (and, where possible, only this one)
    check_imports: bool = False  # the rule is only checked with ``--check-imports``


_OK = "  - {name: b, factory: m.b, terminal: true}\n"

RULES: dict[str, Rule] = {
    "yaml-syntax": Rule(
        "not valid YAML (or a YAML feature omnictl refuses: unknown tags, recursive aliases)", "stages: [\n"
    ),
    "duplicate-key": Rule(
        "a key given twice in one mapping", "stages:\n  - {name: a, factory: m.a, terminal: true, terminal: true}\n"
    ),
    "schema": Rule(
        "unknown field (a typo), wrong type, missing `name`/`factory`, `transport` under "
        "`relay`, `modality` on a non-terminal",
        "stages:\n  - {name: a, factory: m.a, terminl: true}\n",
    ),
    "duplicate-stage": Rule(
        "two stages share a name",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n" + _OK + "  - {name: a, factory: m.c, terminal: true}\n",
    ),
    "routing-mode": Rule(
        "not exactly one of `next` / `route_fn` / `terminal: true`; `stream_to` without `next`",
        "stages:\n  - {name: a, factory: m.a, next: [b], terminal: true}\n" + _OK,
    ),
    "route-candidates": Rule(
        "`route_fn` without `next` listing its candidates",
        "stages:\n  - {name: a, factory: m.a, route_fn: m.route}\n" + _OK,
    ),
    "unknown-stage": Rule(
        "`next`, `wait_for`, `stream_to` or `project` names no stage",
        "stages:\n  - {name: a, factory: m.a, next: [bb]}\n" + _OK,
    ),
    "self-reference": Rule(
        "a stage names itself in `next`, `wait_for` or `stream_to`",
        "stages:\n  - {name: a, factory: m.a, next: [a, b]}\n" + _OK,
    ),
    "fan-in-pair": Rule(
        "`wait_for` without `merge_fn`, or the reverse",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n  - {name: b, factory: m.b, terminal: true, wait_for: [a]}\n",
    ),
    "fan-in-sources": Rule(
        "several upstreams but no `wait_for`, or `wait_for` differs from the upstreams",
        "stages:\n  - {name: a, factory: m.a, next: [b, c]}\n"
        "  - {name: b, factory: m.b, next: [c]}\n"
        "  - {name: c, factory: m.c, terminal: true}\n",
    ),
    "entry": Rule(
        "no stage, or several stages, without an incoming edge",
        "stages:\n  - {name: a, factory: m.a, next: [c]}\n"
        "  - {name: b, factory: m.b, next: [c]}\n"
        "  - {name: c, factory: m.c, terminal: true, wait_for: [a, b], merge_fn: m.merge}\n",
    ),
    "unreachable": Rule(
        "a stage the entry cannot reach",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n" + _OK + "  - {name: c, factory: m.c, next: [d]}\n"
        "  - {name: d, factory: m.d, next: [c]}\n",
    ),
    "dead-end": Rule(
        "no terminal at all, or a stage that cannot reach one",
        "stages:\n  - {name: a, factory: m.a, next: [b, c]}\n" + _OK + "  - {name: c, factory: m.c, next: [d]}\n"
        "  - {name: d, factory: m.d, next: [c]}\n",
    ),
    "cycle": Rule(
        "the `next` graph has a cycle",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n"
        "  - {name: b, factory: m.b, next: [c]}\n"
        "  - {name: c, factory: m.c, next: [b, d]}\n"
        "  - {name: d, factory: m.d, terminal: true}\n",
    ),
    "tp-size": Rule(
        "`tp_size` ≠ length of the `gpu` list, `tp_size` > 1 beside a single GPU id, negative or repeated GPU ids",
        "stages:\n  - {name: a, factory: m.a, next: [b], gpu: [0, 1], tp_size: 4}\n" + _OK,
    ),
    "process-placement": Rule(
        "a tensor-parallel stage shares its process; one process's GPU stages on different GPUs",
        "stages:\n  - {name: a, factory: m.a, next: [b], gpu: 0, process: p}\n"
        "  - {name: b, factory: m.b, terminal: true, gpu: 1, process: p}\n",
    ),
    "tp-node": Rule(
        "a process (so a tensor-parallel group's ranks) given more than one `node` label",
        "stages:\n  - {name: a, factory: m.a, next: [b], tp_size: 2}\n" + _OK + "processes:\n  a: {node: [n1, n2]}\n",
    ),
    "unknown-process": Rule(
        "a key of `processes` that no stage runs in",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n" + _OK + "processes:\n  c: {replicas: 2}\n",
    ),
    "replica-bounds": Rule(
        "`replicas: {min, max}` with `min` above `max`",
        "stages:\n  - {name: a, factory: m.a, next: [b]}\n" + _OK + "processes:\n  a: {replicas: {min: 3, max: 2}}\n",
    ),
    "import": Rule(
        "(`--check-imports`) a factory, route_fn, merge_fn or projection cannot be imported or is not callable",
        "stages:\n  - {name: a, factory: omnictl_no_such_module.a, terminal: true}\n",
        check_imports=True,
    ),
}
