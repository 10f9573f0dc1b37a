"""Whole-graph rules: entry, unreachable, dead-end, cycle."""

from __future__ import annotations

CHAIN = """
stages:
  - name: a
    factory: m.a
    next: [b]
  - name: b
    factory: m.b
    next: [c]
  - name: c
    factory: m.c
    terminal: true
"""


def where(issues):
    return [(i.line, i.stage) for i in issues]


def test_chain_is_valid(lint) -> None:
    assert lint(CHAIN) == []


def test_no_stages_is_an_entry_error(lint) -> None:
    issues = lint("stages: []\n")
    assert [(i.rule, i.line) for i in issues] == [("entry", 1)]


def test_several_entries_point_at_the_second(lint) -> None:
    text = CHAIN + "  - name: d\n    factory: m.d\n    next: [c]\n"
    issues = lint(text, "entry")
    assert where(issues) == [(11, "d")]
    assert "(a, d)" in issues[0].message


def test_no_entry_when_everything_has_an_incoming_edge(lint) -> None:
    text = CHAIN.replace("    terminal: true", "    next: [a]")
    issues = lint(text, "entry")
    assert where(issues) == [(2, "a")]
    assert lint(CHAIN, "entry") == []


def test_a_stream_edge_counts_as_incoming(lint) -> None:
    # d only receives a stream from a: it is not a second entry, and it is reachable.
    text = CHAIN.replace("    next: [b]", "    next: [b, d]\n    stream_to: [d]") + (
        "  - name: d\n    factory: m.d\n    terminal: true\n")
    assert lint(text) == []


def test_unreachable(lint) -> None:
    # x and y feed each other, so neither is an entry, and the entry cannot reach them.
    text = CHAIN + ("  - name: x\n    factory: m.x\n    next: [y]\n"
                    "  - name: y\n    factory: m.y\n    next: [x, c]\n")
    issues = lint(text, "unreachable")
    assert where(issues) == [(11, "x"), (14, "y")]
    assert "entry stage 'a'" in issues[0].message


def test_dead_end_stage(lint) -> None:
    text = CHAIN.replace("next: [b]", "next: [b, d]") + (
        "  - name: d\n    factory: m.d\n    next: [e]\n"
        "  - name: e\n    factory: m.e\n    route_fn: m.r\n    next: [d]\n")
    issues = lint(text, "dead-end")
    assert where(issues) == [(11, "d"), (14, "e")]
    assert lint(CHAIN, "dead-end") == []


def test_no_terminal_at_all(lint) -> None:
    text = CHAIN.replace("    terminal: true", "    next: [b]")
    issues = lint(text, "dead-end")
    assert [(i.line, i.column, i.stage) for i in issues] == [(1, 1, None)]
    assert "no stage is terminal" in issues[0].message


def test_cycle_names_the_stages_on_it(lint) -> None:
    text = CHAIN.replace("next: [c]", "next: [c, a]")
    issues = lint(text, "cycle")
    assert where(issues) == [(4, "a")]
    assert "a -> b -> a" in issues[0].message
    assert lint(CHAIN, "cycle") == []


def test_two_separate_cycles_are_two_issues(lint) -> None:
    text = CHAIN.replace("next: [c]", "next: [c, a]") + (
        "  - name: d\n    factory: m.d\n    next: [e]\n"
        "  - name: e\n    factory: m.e\n    next: [d, c]\n")
    messages = [i.message for i in lint(text, "cycle")]
    assert len(messages) == 2
    assert "a -> b -> a" in messages[0] and "d -> e -> d" in messages[1]


def test_long_chain_does_not_hit_the_recursion_limit(lint) -> None:
    count = 3000
    lines = ["stages:"]
    for i in range(count):
        route = "terminal: true" if i == count - 1 else f"next: [s{i + 1}]"
        lines += [f"  - name: s{i}", f"    factory: m.s{i}", f"    {route}"]
    assert lint("\n".join(lines) + "\n") == []


def test_no_terminal_is_not_repeated_when_the_terminal_stage_is_malformed(lint) -> None:
    # The terminal stage's name is not a string: the schema reports that, nothing more.
    text = CHAIN.replace("name: c", "name: 7")
    assert {i.rule for i in lint(text)} == {"schema", "unknown-stage"}


LONG_LOOP = """
stages:
  - name: a
    factory: m.a
    next: [b]
  - name: b
    factory: m.b
    next: [c]
  - name: c
    factory: m.c
    next: [d, a]
  - name: d
    factory: m.d
    terminal: true
"""


def test_a_three_stage_cycle_is_reported_once_from_its_first_stage(lint) -> None:
    # Tarjan must carry c's low-link back through b to a: otherwise the loop is
    # cut short ("b -> b") and blamed on the wrong stage and line.
    issues = lint(LONG_LOOP, "cycle")
    assert where(issues) == [(4, "a")]
    assert issues[0].message == "the `next` graph has a cycle: a -> b -> c -> a"


def test_a_cycle_with_a_side_branch_names_every_stage_on_it(lint) -> None:
    # b -> x -> c is a second way round inside the same component: one issue, x listed.
    text = LONG_LOOP.replace("next: [c]", "next: [c, x]") + (
        "  - name: x\n    factory: m.x\n    next: [c]\n")
    issues = lint(text, "cycle")
    assert where(issues) == [(4, "a")]
    assert issues[0].message == "the `next` graph has a cycle: a -> b -> c -> a (also on it: x)"
