"""A topology drawn as a Mermaid flowchart: what ``omnictl validate --graph`` prints.

Drawn from the derived :class:`Topology`, never from the YAML text, so the picture shows
what omnictl will run: one box per OS process (with its GPU and replicas), a node per
stage, a solid arrow per ``next`` edge (dashed for ``stream_to``), each labelled with its
transport, and the terminals' modalities. The output is deterministic (file order), so the
docs can embed it and a test can tell when a drawing is stale.
"""

from __future__ import annotations

import re

from omnictl.topology.model import EdgeKind, Topology

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _node_id(name: str) -> str:
    # Mermaid ids: letters, digits, underscore; a prefix keeps words like `end` legal.
    return "s_" + _UNSAFE.sub("_", name)


def _label(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def mermaid(topology: Topology) -> str:
    """The Mermaid ``flowchart LR`` source for ``topology`` (no trailing newline)."""
    lines = ["flowchart LR"]
    lines.append(f"  client([client]) --> {_node_id(topology.entry)}")
    for process in topology.processes.values():
        where = ", ".join(f"gpu {g}" for g in process.gpus) or "cpu"
        extra = f", {process.replicas} replicas" if process.replicas > 1 else ""
        node = f", node {process.node}" if process.node else ""
        lines.append(
            f"  subgraph p_{_UNSAFE.sub('_', process.name)}[{_label(f'process {process.name} ({where}{extra}{node})')}]"
        )
        for name in process.stages:
            spec = topology.stages[name]
            if spec.terminal:
                text = f"{name}<br/>→ {topology.terminals[name]}"
                lines.append(f"    {_node_id(name)}[[{_label(text)}]]")
            elif spec.route_fn is not None:
                lines.append(f"    {_node_id(name)}{{{{{_label(name + '<br/>route_fn')}}}}}")
            elif spec.wait_for:
                lines.append(f"    {_node_id(name)}[/{_label(name + '<br/>wait_for ' + ', '.join(spec.wait_for))}/]")
            else:
                lines.append(f"    {_node_id(name)}[{_label(name)}]")
        lines.append("  end")
    for edge in topology.edges:
        arrow = "-.->" if edge.kind is EdgeKind.STREAM else "-->"
        text = f"stream, {edge.transport.value}" if edge.kind is EdgeKind.STREAM else edge.transport.value
        lines.append(f"  {_node_id(edge.src)} {arrow}|{text}| {_node_id(edge.dst)}")
    for name in topology.terminals:
        lines.append(f"  {_node_id(name)} --> client_out([client])")
    return "\n".join(lines)
