"""`omnictl trace`: one request's timeline across stages and hops, read from a run's trace store."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from omnictl.cli.invocation import program
from omnictl.cli.words import count

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from omnictl.profiling.events import Event
    from omnictl.profiling.rundir import StageInfo
    from omnictl.profiling.store import TraceStore


class TraceFormat(str, enum.Enum):
    text = "text"
    json = "json"


DEFAULT_URL = "http://127.0.0.1:8000"  # where `omnictl serve` listens by default
HEALTH_TIMEOUT_S = 2.0  # a server that does not answer /health by then is looked past, not waited for


class ServerRun:
    """What the server at ``url`` said of its run directory: ``directory`` when it named one
    on this machine, else ``why`` it was not used (no server there, no key, another machine)."""

    def __init__(self, url: str, directory: Path | None, why: str | None) -> None:
        self.url, self.directory, self.why = url, directory, why


def server_run(url: str, api_key: str | None) -> ServerRun:
    """Ask the server at ``url`` where it records traces (its ``/health`` names its run
    directory to a client with the key, as ``omnictl bench`` reads it)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/health", headers=headers, timeout=HEALTH_TIMEOUT_S)
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        return ServerRun(url, None, f"no omnictl server answered at {url} ({type(exc).__name__})")
    if not isinstance(body, dict) or "status" not in body:
        return ServerRun(url, None, f"{url}/health is not an omnictl server's")
    if "run_dir" not in body:  # the verdict only: the run directory is the key's
        return ServerRun(url, None, f"the server at {url} names its run directory only to its API key (--api-key)")
    reported = body["run_dir"]
    if not reported:
        return ServerRun(url, None, f"the server at {url} records no traces (profiling is off)")
    if not Path(reported).is_dir():
        return ServerRun(url, None, f"the server at {url} records into {reported}, not on this machine")
    return ServerRun(url, Path(reported), None)


def trace(
    request_id: str | None = typer.Argument(
        None, metavar="REQUEST_ID", help="The request to show (list ids with --last N or --slowest N)."
    ),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        metavar="DIR",
        help="Run directory (default: the running server's, asked at --url; else, for REQUEST_ID, the newest run "
        "that recorded it, for --last / --slowest, the latest run).",
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
    url: str = typer.Option(
        DEFAULT_URL,
        "--url",
        envvar="OMNICTL_URL",
        metavar="URL",
        help="Without --run-dir: the running server to ask (its /health) where it records traces, "
        "searched before the runs under the state directory.",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="OMNICTL_API_KEY",
        metavar="KEY",
        help="The server's API key: its /health names its run directory only to the key.",
    ),
) -> None:
    """Show one request's timeline across stages and hops, or find request ids."""
    # Imported here so `omnictl --help` stays instant.
    from rich.console import Console

    from omnictl.profiling.store import TraceError, TraceStore, default_runs, find_request, resolve_run_dir

    console = Console(highlight=False)
    if (last is not None) + (slowest is not None) + (request_id is not None) != 1:
        raise typer.BadParameter("give exactly one of REQUEST_ID, --last N, --slowest N")
    if run_dir is None:
        server = server_run(url, api_key)
        if request_id is not None:
            # the server's run first, then the runs under the state directory, newest first
            runs = ([server.directory] if server.directory is not None else []) + [
                run for run in default_runs() if server.directory is None or run != server.directory
            ]
            found = find_request(request_id, runs)
            if found is None:
                _fail(f"no events for request {request_id!r} in {_searched(server, runs)}. {_hint(server)}")
            directory, events = found
            _show(console, request_id, events, output_format, export_chrome, directory)
            return
        if server.directory is not None:
            run_dir = server.directory
    else:
        server = None
    try:
        directory = resolve_run_dir(run_dir)
    except TraceError as error:
        _fail(str(error) + (f" ({server.why})" if server is not None and server.why is not None else ""))
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


def _searched(server: ServerRun, runs: list[Path]) -> str:
    """Where an id was looked for, as the user should read it."""
    from omnictl.profiling.rundir import runs_root

    others = len(runs) - (server.directory is not None)
    where = [f"the run of the server at {server.url} ({server.directory})"] if server.directory is not None else []
    where.append(f"{count(others, 'recent run')} under {runs_root()}")
    note = f" ({server.why})" if server.why is not None else ""
    return " nor in ".join(where) + note


def _hint(server: ServerRun) -> str:
    """How to list the ids recorded in the same places the search looked."""
    if server.directory is not None:
        return (
            f"List the server's recorded ids with `{program()} trace --last 20 --run-dir {server.directory}` "
            "(or `--slowest 20`)."
        )
    return (
        f"List recorded ids with `{program()} trace --last 20` (the latest run under the state directory), "
        f"or name the server with --url URL (and --api-key) or its run with --run-dir DIR (serve prints it)."
    )


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
