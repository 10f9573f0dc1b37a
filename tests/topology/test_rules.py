"""Name, routing, reference and fan-in rules: each triggered, and each quiet when satisfied."""

from __future__ import annotations

CHAIN = """
stages:
  - name: a
    factory: m.a
    next: [b]
  - name: b
    factory: m.b
    terminal: true
"""

FAN_IN = """
stages:
  - name: split
    factory: m.split
    next: [left, right]
  - name: left
    factory: m.left
    next: [join]
  - name: right
    factory: m.right
    next: [join]
  - name: join
    factory: m.join
    wait_for: [left, right]
    merge_fn: m.merge
    terminal: true
"""


def where(issues):
    return [(i.line, i.stage, i.field) for i in issues]


def test_the_base_topologies_are_valid(lint) -> None:
    assert lint(CHAIN) == []
    assert lint(FAN_IN) == []


def test_duplicate_stage_points_at_the_second_name(lint) -> None:
    text = CHAIN + "  - name: b\n    factory: m.c\n    terminal: true\n"
    issues = lint(text, "duplicate-stage")
    assert where(issues) == [(8, "b", "name")]
    assert "already used at line 5" in issues[0].message
    assert lint(CHAIN, "duplicate-stage") == []


def test_routing_mode_none(lint) -> None:
    issues = lint(CHAIN.replace("    terminal: true\n", ""), "routing-mode")
    assert where(issues) == [(5, "b", None)]
    assert "no routing mode" in issues[0].message


def test_routing_mode_terminal_with_next_or_route_fn(lint) -> None:
    text = CHAIN.replace("    next: [b]", "    next: [b]\n    terminal: true")
    issues = lint(text, "routing-mode")
    assert where(issues) == [(5, "a", "terminal")]
    text = CHAIN.replace("    terminal: true", "    terminal: true\n    route_fn: m.r")
    assert "route_fn" in lint(text, "routing-mode")[0].message


def test_terminal_false_with_next_is_fine(lint) -> None:
    assert lint(CHAIN.replace("    next: [b]", "    next: [b]\n    terminal: false")) == []


def test_stream_to_without_next_is_a_routing_error(lint) -> None:
    text = CHAIN.replace("    terminal: true", "    terminal: true\n    stream_to: [a]")
    assert where(lint(text, "routing-mode")) == [(8, "b", "stream_to")]


def test_route_candidates(lint) -> None:
    text = CHAIN.replace("    next: [b]", "    route_fn: m.route")
    issues = lint(text, "route-candidates")
    assert where(issues) == [(4, "a", "route_fn")]
    assert lint(text, "routing-mode") == []  # route_fn is a routing mode; only candidates lack
    assert lint(CHAIN.replace("    next: [b]", "    route_fn: m.route\n    next: [b]")) == []


def test_unknown_stage_in_each_reference_field(lint) -> None:
    text = FAN_IN.replace("next: [left, right]", "next: [left, rihgt, right]").replace(
        "wait_for: [left, right]", "wait_for: [left, right, nobody]").replace(
        "    next: [join]\n  - name: right", "    next: [join]\n    stream_to: ghost\n"
        "    project: {phantom: m.p}\n  - name: right")
    issues = lint(text, "unknown-stage")
    assert [(i.line, i.column, i.field) for i in issues] == [
        (4, 18, "next"), (8, 16, "stream_to"), (9, 15, "project"), (15, 29, "wait_for")]
    assert "did you mean 'right'" in (issues[0].hint or "")
    assert lint(FAN_IN, "unknown-stage") == []


def test_self_reference(lint) -> None:
    text = CHAIN.replace("next: [b]", "next: [b, a]")
    issues = lint(text, "self-reference")
    assert [(i.line, i.column, i.field) for i in issues] == [(4, 15, "next")]
    text = FAN_IN.replace("wait_for: [left, right]", "wait_for: [left, right, join]")
    assert [i.field for i in lint(text, "self-reference")] == ["wait_for"]
    text = CHAIN.replace("next: [b]", "next: [b]\n    stream_to: [a]")
    assert [i.field for i in lint(text, "self-reference")] == ["stream_to"]


def test_fan_in_pair(lint) -> None:
    issues = lint(FAN_IN.replace("    merge_fn: m.merge\n", ""), "fan-in-pair")
    assert where(issues) == [(13, "join", "wait_for")]
    issues = lint(FAN_IN.replace("    wait_for: [left, right]\n", ""), "fan-in-pair")
    assert where(issues) == [(13, "join", "merge_fn")]
    assert lint(FAN_IN, "fan-in-pair") == []


def test_fan_in_sources_without_wait_for(lint) -> None:
    text = FAN_IN.replace("    wait_for: [left, right]\n    merge_fn: m.merge\n", "")
    issues = lint(text, "fan-in-sources")
    assert where(issues) == [(11, "join", None)]
    assert "receives from left, right" in issues[0].message


def test_fan_in_sources_names_missing_and_extra(lint) -> None:
    text = FAN_IN.replace("wait_for: [left, right]", "wait_for: [left, split]")
    issues = lint(text, "fan-in-sources")
    assert where(issues) == [(13, "join", "wait_for")]
    assert "missing right" in issues[0].message
    assert "extra split" in issues[0].message
    assert lint(FAN_IN, "fan-in-sources") == []


def test_every_problem_is_reported_not_only_the_first(lint) -> None:
    text = CHAIN.replace("next: [b]", "next: [b, zz, a]") + "  - name: b\n    factory: m.c\n"
    rules = {i.rule for i in lint(text)}
    assert {"unknown-stage", "self-reference", "duplicate-stage"} <= rules
