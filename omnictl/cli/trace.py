"""`omnictl trace`: one request's timeline across stages and hops, read from a run's trace store."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from omnictl.cli.invocation import program

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from omnictl.profiling.events import Event
    from omnictl.profiling.rundir import StageInfo
    from omnictl.profiling.store import TraceStore


class TraceFormat(str, enum.Enum):
    text = "text"
    json = "json"


def trace(
    request_id: str | None = typer.Argument(
        None, metavar="REQUEST_ID", help="The request to show (list ids with --last N or --slowest N)."
    ),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        metavar="DIR",
        help="Run directory (default: for REQUEST_ID, the newest run that recorded it; for --last / --slowest, the latest run).",
    ),
    output_format: TraceFormat = typer.Option(
        TraceFormat.text, "--format", help="text: a waterfall; json: events and spans."
    ),
    export_chrome: Path | None = typer.Option(
        None, "--export-chrome", metavar="FILE", help="Also write Chrome/Perfetto trace JSON to FILE."
    ),
    last: int | None = typer.Option(None, "--last", min=1, metavar="N", help="List the N most recent request ids."),
    slowest: int | None = typer.Option(
        None, "--slowest", min=1, metavar="N", help="List the N slowest finished request ids."
    ),
) -> None:
    """Show one request's timeline across stages and hops, or find request ids."""
    # Imported here so `omnictl --help` stays instant.
    from rich.console import Console

    from omnictl.profiling.store import TraceError, TraceStore, default_runs, find_request, resolve_run_dir

    console = Console(highlight=False)
    if (last is not None) + (slowest is not None) + (request_id is not None) != 1:
        raise typer.BadParameter("give exactly one of REQUEST_ID, --last N, --slowest N")
    if request_id is not None and run_dir is None:
        runs = default_runs()
        found = find_request(request_id, runs)
        if found is None:
            _fail(
                f"no events for request {request_id!r} in the {len(runs)} recent run(s) under "
                f"{runs[0].parent if runs else 'the state directory'}. List recorded ids with "
                f"`{program()} trace --last 20`, or pass the server's --run-dir DIR (serve prints it)."
            )
        directory, events = found
        _show(console, request_id, events, output_format, export_chrome, directory)
        return
    try:
        directory = resolve_run_dir(run_dir)
    except TraceError as error:
        _fail(str(error))
    store = TraceStore(directory)
    if request_id is None:
        _list_ids(console, store, directory, last, slowest, output_format)
        return
    events = store.events(request_id)
    if not events:
        _fail(
            f"no events for request {request_id!r} in {directory}. "
            f"List recorded ids with `{program()} trace --last 20 --run-dir {run_dir}` (or `--slowest 20`).",
        )
    _show(console, request_id, events, output_format, export_chrome, directory)


def _show(
    console: Console,
    request_id: str,
    events: list[Event],
    output_format: TraceFormat,
    export_chrome: Path | None,
    directory: Path,
) -> None:
    from omnictl.profiling.chrome import to_chrome
    from omnictl.profiling.rundir import read_run_info
    from omnictl.profiling.spans import build_trace
    from omnictl.profiling.trace_render import render_waterfall, trace_to_json

    trace_ = build_trace(request_id, events)
    if output_format is TraceFormat.json:
        typer.echo(json.dumps(trace_to_json(trace_), indent=2, ensure_ascii=False))
    else:
        console.print(f"run {directory}", soft_wrap=True)
        info = read_run_info(directory)
        nodes = {stage.name: stage.node for stage in info.stages} if info is not None else None
        groups = {s.name: _ranks_label(s) for s in info.stages if s.tp_size > 1} if info is not None else None
        console.print(
            render_waterfall(trace_, width=min(console.width, 120), nodes=nodes, groups=groups), soft_wrap=True
        )
    if export_chrome is not None:
        export_chrome.write_text(json.dumps(to_chrome(trace_)), encoding="utf-8")
        typer.echo(
            f"Chrome trace written to {export_chrome} (open it in https://ui.perfetto.dev or chrome://tracing)",
            err=True,
        )


def _list_ids(
    console: Console,
    store: TraceStore,
    directory: Path,
    last: int | None,
    slowest: int | None,
    output_format: TraceFormat,
) -> None:
    from omnictl.profiling.units import format_seconds

    summaries = store.select(last=last, slowest=slowest)
    if output_format is TraceFormat.json:
        rows = [
            {"request_id": s.request_id, "status": s.status, "start_ns": s.start_ns, "duration_s": s.duration_s}
            for s in summaries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not summaries:
        console.print(f"no requests recorded in {directory}")
        return
    console.print(f"run {directory}", soft_wrap=True)
    console.print(f"{'request id':<36} {'status':<10} {'duration':>10}")
    for s in summaries:
        console.print(f"{s.request_id:<36} {s.status:<10} {format_seconds(s.duration_s):>10}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    from omnictl.cli.help import command

    command(app, "trace")(trace)


def _ranks_label(stage: StageInfo) -> str:
    """Where a tensor-parallel stage's ranks ran: one GPU each, or ``N CPU ranks``."""
    if stage.gpu:
        return f"{len(stage.gpu)} ranks on GPUs " + ",".join(str(g) for g in stage.gpu)
    return f"{stage.tp_size} CPU ranks"
