"""`omnictl validate FILE...`: every problem with file:line, or what omnictl derived.

A thin shell over :func:`omnictl.topology.validate`. Exit codes: 0 all valid, 1 some file
invalid, 2 some file could not be read.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Union

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from omnictl.cli.words import count
from omnictl.topology import Topology, TopologyReadError, ValidationReport, on_cpu, validate

Outcome = Union[ValidationReport, TopologyReadError]

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def check_files(files: list[Path], check_imports: bool) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for file in files:
        try:
            outcomes.append(validate(file, check_imports=check_imports))
        except TopologyReadError as error:
            outcomes.append(error)
    return outcomes


def exit_code(outcomes: list[Outcome]) -> int:
    if any(isinstance(o, TopologyReadError) for o in outcomes):
        return EXIT_UNREADABLE
    if any(not o.valid for o in outcomes if isinstance(o, ValidationReport)):
        return EXIT_INVALID
    return EXIT_VALID


def outcome_json(outcome: Outcome) -> dict[str, object]:
    if isinstance(outcome, ValidationReport):
        return outcome.to_json()
    error = {
        "rule": "read",
        "stage": None,
        "field": None,
        "line": None,
        "column": None,
        "message": f"cannot read topology file: {outcome.reason}",
        "hint": None,
        "follows_from": None,
    }
    return {"file": outcome.path, "valid": False, "errors": [error], "derived": None}


def render_json(outcomes: list[Outcome]) -> str:
    items = [outcome_json(o) for o in outcomes]
    return json.dumps(items[0] if len(items) == 1 else items, indent=2)


def summary(topology: Topology) -> Group:
    """Processes x stages x GPUs x replicas (x node x cpus when labelled), then edges with their transports."""
    terminals = ", ".join(f"{name} ({modality})" for name, modality in topology.terminals.items())
    head = Text.assemble(("  entry ", "dim"), (topology.entry, "bold"), ("  terminals ", "dim"), terminals)
    processes = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    multi_node = topology.multi_node()
    for column in ("process", "stages", "gpus", "replicas", *(("node", "cpus") if multi_node else ())):
        processes.add_column(column)
    for process in topology.processes.values():
        gpus = ", ".join(str(g) for g in process.gpus) or "cpu"
        replicas = f"{process.elastic.min}-{process.replicas}" if process.elastic is not None else str(process.replicas)
        row = [process.name, ", ".join(process.stages), gpus, replicas]
        if multi_node:  # "-": the coordinator's machine
            row += [process.node or "-", f"{process.cpus:g}"]
        processes.add_row(*row)
    edges = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    kinds: dict[tuple[str, str], list[str]] = {}
    transports: dict[tuple[str, str], str] = {}
    for edge in topology.edges:  # data and stream between one pair share a placement
        kinds.setdefault((edge.src, edge.dst), []).append(edge.kind.value)
        transports[(edge.src, edge.dst)] = edge.transport.value
    # `serve --device cpu` drops the GPU placement: its edges are what a CPU serve really uses
    # (shared memory where the GPUs would have had cuda_ipc or relay), shown when they differ.
    on_cpu_transports = {(e.src, e.dst): e.transport.value for e in on_cpu(topology).edges}
    differs = on_cpu_transports != transports
    for column in ("edge", "kind", "transport", *(("with --device cpu",) if differs else ())):
        edges.add_column(column)
    for (src, dst), pair_kinds in kinds.items():
        cpu_column = (on_cpu_transports[(src, dst)],) if differs else ()
        edges.add_row(f"{src} -> {dst}", "+".join(pair_kinds), transports[(src, dst)], *cpu_column)
    groups = group_table(topology)
    return Group(head, Text(""), processes, *((Text(""), groups) if groups is not None else ()), Text(""), edges)


def _os_processes(topology: Topology) -> str:
    """How many OS processes the replicas make, when that differs from the process count."""
    instances = len(topology.instances())
    return f", {count(instances, 'OS process')} with replicas" if instances != len(topology.processes) else ""


def group_table(topology: Topology) -> Table | None:
    """One row per rank of each tensor-parallel group: where it runs and what it is."""
    groups = topology.tensor_parallel()
    if not groups:
        return None
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for column in ("tp group", "rank", "runs on", "node", "role"):
        table.add_column(column)
    for spec in groups:
        node = topology.processes[spec.process].node or "-"
        for rank in range(spec.tp_size):
            role = "stage process (the coordinator and other stages talk to it)" if rank == 0 else "follower"
            table.add_row(spec.name if rank == 0 else "", str(rank), spec.rank_device(rank), node, role)
    return table


def trust_warnings(file: str, topology: Topology) -> list[str]:
    """Valid, but a stage calls into the standard library (``os.system``, ``builtins.eval``)."""
    from omnictl.topology.trust import unexpected_callables

    return [
        f"{file}:{line}: warning: stage {stage!r}: `{field}` is {dotted!r}, a standard-library "
        "callable rather than one defined in your code or omnictl; the runtime will call it with "
        "the topology's arguments: serve only topologies you trust"
        for line, stage, field, dotted in unexpected_callables(topology)
    ]


def render_text(outcomes: list[Outcome], console: Console) -> None:
    for outcome in outcomes:
        if isinstance(outcome, TopologyReadError):
            console.print(
                f"{outcome.path}: error: cannot read topology file: {outcome.reason}",
                markup=False,
                highlight=False,
                style="red",
            )
        elif outcome.valid and outcome.topology is not None:
            topology = outcome.topology
            console.print(
                Text.assemble(
                    (f"{outcome.file}: ", "bold"),
                    ("valid", "green bold"),
                    f" ({topology.name}: {count(len(topology.stages), 'stage')}, "
                    f"{count(len(topology.processes), 'process')}{_os_processes(topology)})",
                )
            )
            console.print(summary(topology))
            for warning in trust_warnings(outcome.file, topology):
                console.print(warning, markup=False, highlight=False, style="yellow")
        else:
            for issue in outcome.issues:
                console.print(issue.format(), markup=False, highlight=False)
            follow = sum(1 for issue in outcome.issues if issue.follows_from)
            detail = f"; {follow} {'follows' if follow == 1 else 'follow'} from the others" if follow else ""
            console.print(
                Text.assemble(
                    (f"{outcome.file}: ", "bold"),
                    ("invalid", "red bold"),
                    f" ({count(len(outcome.issues), 'problem')}{detail})",
                )
            )
    if len(outcomes) > 1:
        valid = sum(1 for o in outcomes if isinstance(o, ValidationReport) and o.valid)
        unreadable = sum(1 for o in outcomes if isinstance(o, TopologyReadError))
        console.print(
            f"{len(outcomes)} files: {valid} valid, "
            f"{len(outcomes) - valid - unreadable} invalid, {unreadable} unreadable",
            markup=False,
            highlight=False,
        )


def render_graphs(outcomes: list[Outcome], console: Console) -> None:
    """Mermaid source for each valid file (a ``%%`` comment names the file when there are
    several); an invalid or unreadable file is reported as in text mode, on stderr."""
    from omnictl.topology.graph import mermaid

    errors = Console(stderr=True, soft_wrap=True)
    for outcome in outcomes:
        if isinstance(outcome, ValidationReport) and outcome.valid and outcome.topology is not None:
            if len(outcomes) > 1:
                typer.echo(f"%% {outcome.file}")
            typer.echo(mermaid(outcome.topology))
        else:
            render_text([outcome], errors)


def validate_command(
    files: Annotated[
        list[Path], typer.Argument(help="Topology YAML files to check.", metavar="FILE...", show_default=False)
    ],
    check_imports: Annotated[
        bool,
        typer.Option(
            "--check-imports",
            help="Also import every factory, route_fn, merge_fn and projection, and check it is callable.",
        ),
    ] = False,
    output_format: Annotated[
        OutputFormat,
        typer.Option("--format", help="text: compiler-style errors and a summary; json: one object per file."),
    ] = OutputFormat.text,
    graph: Annotated[
        bool,
        typer.Option(
            "--graph",
            help="Print each valid topology as a Mermaid flowchart (processes, stages, "
            "edges with their transports) instead of the summary; problems are reported as usual.",
        ),
    ] = False,
) -> None:
    """Check topology files: every problem at file:line:col, or what omnictl derives."""
    outcomes = check_files(files, check_imports)
    if graph:
        render_graphs(outcomes, Console(soft_wrap=True))
    elif output_format is OutputFormat.json:
        typer.echo(render_json(outcomes))
    else:
        render_text(outcomes, Console(soft_wrap=True))
    raise typer.Exit(exit_code(outcomes))


def register(app: typer.Typer) -> None:
    from omnictl.cli.help import command

    command(app, "validate")(validate_command)
