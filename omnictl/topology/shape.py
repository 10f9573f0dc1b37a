"""Whole-graph rules: one entry, everything reachable, every stage reaches a terminal, no cycle."""

from __future__ import annotations

from collections import deque
from typing import Iterable

from omnictl.topology.raw import RawStage, Reporter

Graph = dict[str, list[str]]


def data_graph(by_name: dict[str, RawStage]) -> Graph:
    """`next` edges between known stages, self-references left out (reported on their own)."""
    return {name: [t for t in (stage.next or ()) if t in by_name and t != name] for name, stage in by_name.items()}


def stream_graph(by_name: dict[str, RawStage]) -> Graph:
    return {name: [t for t in (stage.stream_to or ()) if t in by_name and t != name] for name, stage in by_name.items()}


def reachable(starts: Iterable[str], graph: Graph) -> set[str]:
    """Every node reachable from ``starts`` (included) along ``graph``."""
    seen = set(starts)
    queue = deque(seen)
    while queue:
        for target in graph[queue.popleft()]:
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def check_entry_and_reach(by_name: dict[str, RawStage], report: Reporter) -> None:
    """``entry`` and ``unreachable`` (over data and stream edges)."""
    if not by_name:
        report.add(
            "entry",
            "the topology has no stages",
            at=("stages",),
            hint="add at least one stage with `name`, `factory` and `terminal: true`",
        )
        return
    data, stream = data_graph(by_name), stream_graph(by_name)
    both = {n: data[n] + stream[n] for n in by_name}
    targeted = {t for targets in both.values() for t in targets}
    entries = [n for n in by_name if n not in targeted]
    if not entries:
        first = next(iter(by_name.values()))
        report.add(
            "entry",
            "every stage has an incoming edge, so there is no entry stage",
            stage=first,
            hint="the entry is the one stage no `next` or `stream_to` "
            "names; break the loop that leads back to the first stage",
        )
        return
    if len(entries) > 1:
        second = by_name[entries[1]]
        report.add(
            "entry",
            f"{len(entries)} stages have no incoming edge "
            f"({', '.join(entries)}); a topology has exactly one entry stage",
            stage=second,
            hint=f"route to {second.name!r} from an earlier stage's `next`, or remove it",
        )
        return
    reached = reachable(entries, both)
    for name, stage in by_name.items():
        if name not in reached:
            report.add(
                "unreachable",
                f"stage {name!r} cannot be reached from the entry stage {entries[0]!r}",
                stage=stage,
                hint=f"list {name!r} in the `next` of a stage that runs before it",
            )


def check_terminals(by_name: dict[str, RawStage], report: Reporter, terminal_written: bool = False) -> None:
    """``dead-end``: no terminal at all, or a stage from which no terminal is reachable.

    ``terminal_written``: some stage entry says `terminal: true` even if the schema rejected
    that entry (a bad name, say); then "no terminal at all" would only repeat that error.
    """
    if not by_name:
        return
    terminals = [n for n, s in by_name.items() if s.terminal]
    if not terminals and terminal_written:
        return
    if not terminals:
        report.add(
            "dead-end",
            "no stage is terminal, so no result ever returns",
            at=("stages",),
            key=True,
            hint="mark the stages whose results go back to the client `terminal: true`",
        )
        return
    data = data_graph(by_name)
    reverse: Graph = {n: [] for n in by_name}
    for src, targets in data.items():
        for target in targets:
            reverse[target].append(src)
    reaches_terminal = reachable(terminals, reverse)
    for name, stage in by_name.items():
        unrouted = stage.next is None and stage.route_fn is None  # reported by routing-mode
        if name not in reaches_terminal and not unrouted:
            report.add(
                "dead-end",
                f"no terminal stage can be reached from stage {name!r}",
                stage=stage,
                hint="its `next` chain must end at a `terminal: true` stage",
            )


def _cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one stage (Tarjan), in file order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:
        # Iterative DFS: a long generated chain must not hit Python's recursion limit.
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for name in graph:
        if name not in index:
            visit(name)
    order = list(graph)
    return sorted(([n for n in order if n in c] for c in found), key=lambda c: order.index(c[0]))


def _loop_through(start: str, members: set[str], graph: Graph) -> list[str]:
    """One path start -> ... -> start inside a component, for a readable message."""
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in graph[node]:
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return list(reversed(path)) + [start]
            if target in members and target not in parents:
                parents[target] = node
                queue.append(target)
    return [start, start]  # unreachable for a real component


def check_cycles(by_name: dict[str, RawStage], report: Reporter) -> None:
    """``cycle``: the `next` graph must be acyclic."""
    graph = data_graph(by_name)
    for component in _cycles(graph):
        loop = _loop_through(component[0], set(component), graph)
        first = by_name[component[0]]
        also = [n for n in component if n not in loop]
        more = f" (also on it: {', '.join(also)})" if also else ""
        report.add(
            "cycle",
            f"the `next` graph has a cycle: {' -> '.join(loop)}{more}",
            stage=first,
            field="next",
            at=("next",),
            key=True,
            hint="results must flow one way; remove one of these `next` links",
        )
