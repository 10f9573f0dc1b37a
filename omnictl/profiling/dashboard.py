"""The live dashboard (Rich Live) that `serve` and `bench` show, and its plain fallback.

``render_dashboard`` turns a :class:`ProfileSnapshot` into a Rich renderable: a header
(uptime, in flight, outcomes, req/s, time to first text and audio), a row per stage and a
row per edge. The renderable lays itself out for the width it is given: header items wrap
whole, and table columns are dropped (least useful first) until the table fits, so a
number never loses its unit to an ellipsis. ``Dashboard`` keeps it on screen while a run
lasts; without a terminal it prints :func:`status_line` when the figures change.

Conventions, the same in ``serve`` and in ``bench``: ``-`` means "no figure" (nothing
measured, or too few samples for a percentile), ``0`` is a counted zero; figures in grey
are the last window's, shown while nothing new arrived.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from omnictl.profiling.aggregate import EdgeStats, ProfileSnapshot, StageStats
from omnictl.profiling.stats import HeaderStats, SnapshotSource
from omnictl.profiling.units import format_byte_rate, format_rate, format_seconds
from omnictl.topology.model import StageSpec, Topology

# Per-stage figures only the runtime knows: `Pipeline.stats()` as it is, i.e.
# stage -> {"status": "up"|"degraded"|"down"|"unknown", "requests": n, "queued": n, "running": n, ...};
# any key may be missing. "requests" shows as in flight, "queued" as the queue depth, and
# "running" as the batch size unless the scheduler reports `batch_size` in its events.
LiveStats = Mapping[str, Mapping[str, Any]]
DashboardMode = Literal["auto", "live", "lines", "off"]

# Percentiles over fewer samples than this show as "-": p50 of two requests is not a fact.
MIN_SAMPLES_P50 = 3
MIN_SAMPLES_P90 = 5
MIN_SAMPLES_P99 = 10
STALE_STYLE = "dim"
HEARTBEAT_S = 300.0  # `--no-dashboard`: repeat an unchanged status line this rarely


@dataclass(frozen=True)
class _Column:
    header: str
    right: bool
    keep: int  # dropped in increasing order of `keep` when the table is too wide


def render_dashboard(
    snapshot: ProfileSnapshot,
    topology: Topology | None = None,
    live: LiveStats | None = None,
    rejected: int | None = None,
    max_height: int | None = None,
    where: Sequence[str] = (),
) -> RenderableType:
    """``rejected``: requests the HTTP server refused (4xx), when the caller knows them;
    ``max_height``: the rows the dashboard may take (a terminal's height); ``where``: what
    the first line keeps in view whatever the size (the URL, the traces folder)."""
    return DashboardView(snapshot, topology, live or {}, rejected, max_height, tuple(where))


class DashboardView:
    """The dashboard, laid out for whatever width Rich offers when it is rendered and, when
    given, a height: edge rows that do not fit are left out, and a line says how many."""

    def __init__(
        self,
        snapshot: ProfileSnapshot,
        topology: Topology | None,
        live: LiveStats,
        rejected: int | None,
        max_height: int | None = None,
        where: tuple[str, ...] = (),
    ) -> None:
        self.snapshot = snapshot
        self.topology = topology
        self.live = live
        self.rejected = rejected
        self.max_height = max_height
        self.where = where

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        items = _header_items(self.snapshot, self.topology, self.rejected) + _scaling_items(self.topology, self.live)
        header = _wrap_items(items, width)
        if self.where:  # one line, always: shortened from the left of each item if it must be
            header = Text.assemble(_where_line(self.where, width), "\n", header)
        yield header
        columns, rows = _stage_rows(self.snapshot, self.topology, self.live)
        yield _fit(console, options, "stages", columns, rows)
        columns, edges = _edge_rows(self.snapshot, self.topology)
        if self.max_height is None:
            yield _fit(console, options, "edges", columns, edges)
            return
        # title, column names and rule: three rows per table besides its body
        room = self.max_height - (header.plain.count("\n") + 1) - (3 + len(rows)) - 3
        if room >= len(edges):
            yield _fit(console, options, "edges", columns, edges)
            return
        shown = max(0, room - 1)  # one row for the note
        if shown:
            yield _fit(console, options, "edges", columns, edges[:shown])
        yield Text(f"… {len(edges) - shown} more edges (a taller terminal shows them)", style="dim")


def status_line(snapshot: ProfileSnapshot, rejected: int | None = None) -> str:
    """One line for logs and non-terminals (without the time; see :class:`Dashboard`)."""
    h = snapshot.header
    # the dashboard's words (and the coordinator's states): completed, first text, first audio
    outcomes = f"completed {h.completed} failed {h.failed} aborted {h.aborted}"
    if rejected is not None:
        outcomes += f" rejected {rejected}"
    line = (
        f"up {_uptime(h.uptime_s)} | in flight {h.in_flight} | {outcomes} | "
        f"{format_rate(h.requests_per_s)} req/s | "
        f"first text {_percentiles(h.ttft_p50_s, h.ttft_p99_s, h.ttft_n)} | "
        f"first audio {_percentiles(h.ttfa_p50_s, h.ttfa_p99_s, h.ttfa_n)}"
    )
    if h.turn_n:
        line += f" | turn latency {_turn_percentiles(h)}"
    return line + (f" | dropped events {h.dropped_events}" if h.dropped_events else "")


# -- header ---------------------------------------------------------------------------


def _header_items(snapshot: ProfileSnapshot, topology: Topology | None, rejected: int | None) -> list[Text]:
    h = snapshot.header
    figures = STALE_STYLE if h.stale else ""
    items = [
        Text(f"omnictl · {topology.name}" if topology is not None else "omnictl", style="bold"),
        Text(f"up {_uptime(h.uptime_s)}"),
        Text(f"in flight {h.in_flight}"),
        Text(f"completed {h.completed}"),
        _count("failed", h.failed),
    ]
    if rejected is not None:
        items.append(_count("rejected", rejected))
    items += [
        Text(f"aborted {h.aborted}"),
        Text(f"{format_rate(h.requests_per_s)} req/s", style=figures),
        Text(f"first text {_percentiles(h.ttft_p50_s, h.ttft_p99_s, h.ttft_n)}", style=figures),
        Text(f"first audio {_percentiles(h.ttfa_p50_s, h.ttfa_p99_s, h.ttfa_n)}", style=figures),
    ]
    if h.turn_n:  # realtime turns were answered: end of speech -> first audio sent
        items.append(Text(f"turn latency {_turn_percentiles(h)}", style=figures))
    items += [
        Text(f"window {snapshot.window_s:g} s" + (" (idle: last window's figures)" if h.stale else "")),
    ]
    if h.dropped_events:
        items.append(Text(f"dropped events {h.dropped_events}", style="bold red"))
    return items


def _scaling_items(topology: Topology | None, live: LiveStats) -> list[Text]:
    """Per elastic process (`replicas: {min, max}`): the replicas running now, from the live
    stats (a standby or down replica does not count; ``?`` while no stats came)."""
    items: list[Text] = []
    for process in topology.processes.values() if topology is not None else ():
        if process.elastic is None:
            continue
        replicas = live.get(process.stages[0], {}).get("replicas")
        running = (
            str(sum(1 for r in replicas.values() if r.get("status") not in ("standby", "down")))
            if isinstance(replicas, Mapping)
            else "?"
        )
        items.append(Text(f"{process.name} replicas {running} ({process.elastic.min}-{process.replicas})"))
    return items


def _where_line(items: tuple[str, ...], width: int) -> Text:
    """``items`` on one line of at most ``width`` cells. The longest loses characters first,
    after its label (``traces ``) and from the start of its value: a path's end, the run's
    own folder, is what tells runs apart."""
    texts = list(items)
    while len("  ".join(texts)) > width:
        longest = max(range(len(texts)), key=lambda i: len(texts[i]))
        label, _, value = texts[longest].rpartition(" ") if " " in texts[longest] else ("", "", texts[longest])
        label = label + " " if label else ""
        keep = len(value) - (len("  ".join(texts)) - width) - 1
        if keep < 8:
            break
        texts[longest] = label + "…" + value[-keep:]
    return Text("  ".join(texts)[:width], style="bold", no_wrap=True, overflow="crop")


def _count(label: str, value: int) -> Text:
    return Text(f"{label} {value}", style="bold red" if value else "")


def _percentiles(p50: float | None, p99: float | None, n: int) -> str:
    return f"p50 {_enough(p50, n, MIN_SAMPLES_P50)} p99 {_enough(p99, n, MIN_SAMPLES_P99)} (n={n})"


def _turn_percentiles(h: HeaderStats) -> str:
    return (
        f"p50 {_enough(h.turn_p50_s, h.turn_n, MIN_SAMPLES_P50)} "
        f"p90 {_enough(h.turn_p90_s, h.turn_n, MIN_SAMPLES_P90)} (n={h.turn_n})"
    )


def _enough(value: float | None, n: int, minimum: int) -> str:
    return format_seconds(value) if n >= minimum else "-"


def _wrap_items(items: Iterable[Text], width: int) -> Text:
    """Items joined by two spaces; a line breaks between items, never inside one."""
    out = Text(no_wrap=True, overflow="crop")
    used = 0
    for item in items:
        if used and used + 2 + item.cell_len > width:
            out.append("\n")
            used = 0
        elif used:
            out.append("  ")
            used += 2
        out.append_text(item)
        used += item.cell_len
    return out


# -- tables ---------------------------------------------------------------------------

_STAGE_COLUMNS = (
    _Column("stage", False, 100),
    _Column("process", False, 2),
    _Column("gpu", False, 1),
    _Column("in flight", True, 90),
    _Column("queue", True, 5),
    _Column("batch", True, 3),
    _Column("items/s", True, 4),
    _Column("n", True, 70),
    _Column("p50", True, 80),
    _Column("p99", True, 60),
    _Column("share", True, 6),
    _Column("failed", True, 85),
    _Column("rejected", True, 50),
)

_EDGE_COLUMNS = (
    _Column("edge", False, 100),
    _Column("kind", False, 50),
    _Column("transport", False, 2),
    _Column("hops", True, 70),
    _Column("p50", True, 80),
    _Column("p99", True, 60),
    _Column("rate", True, 5),
)


def _stage_rows(
    snapshot: ProfileSnapshot, topology: Topology | None, live: LiveStats
) -> tuple[tuple[_Column, ...], list[list[Text]]]:
    # Names are shown as they come (a replica's process may be "tts#0"): nothing here parses them.
    names = list(topology.stages) if topology is not None else []
    names += [name for name in snapshot.stages if name not in names]
    rows = []
    for name in names:
        stats = snapshot.stages.get(name)
        runtime = live.get(name, {})
        spec = topology.stages.get(name) if topology is not None else None
        process = _process_label(topology, spec.process) if spec is not None else (stats.process if stats else "-")
        gpu = _placement_label(spec) if spec is not None else "-"
        in_flight = runtime.get("requests", stats.in_flight if stats else 0)
        batch = stats.batch_size if stats and stats.batch_size is not None else runtime.get("running")
        status = runtime.get("status")
        measured = stats is not None and stats.n > 0
        style = STALE_STYLE if stats is not None and stats.stale else ""
        cells = [
            Text(f"{name} ({status})", style="bold red") if status in ("down", "degraded") else Text(name),
            Text(process),
            Text(gpu),
            Text(_number(in_flight)),
            Text(_number(runtime.get("queued"))),
            Text(_number(batch)),
            Text(format_rate(stats.items_per_s) if measured and stats else "-", style=style),
            Text(str(stats.n) if stats else "0", style=style),
            *(Text(cell, style=style) for cell in _latencies(stats)),
            Text(f"{stats.share:.0%}" if measured and stats and stats.share is not None else "-", style=style),
            _count_cell(stats.failed if stats else 0),
            _count_cell(stats.rejected if stats else 0),
        ]
        rows.append(cells)
    return _STAGE_COLUMNS, rows


def _placement_label(spec: StageSpec) -> str:
    """Where the stage runs: ``cpu``, its GPU, a group's GPUs (``0,1``: one per rank) or
    CPU ranks (``cpu x2``): a tensor-parallel group is one stage, its ranks shown here."""
    if spec.gpu:
        return ",".join(str(g) for g in spec.gpu)
    return f"cpu x{spec.tp_size}" if spec.tp_size > 1 else "cpu"


def _process_label(topology: Topology | None, process: str) -> str:
    """The process, or its replicas' names (``tts#0,tts#1``) when it has several."""
    spec = topology.processes.get(process) if topology is not None else None
    return ",".join(spec.instances) if spec is not None and spec.replicas > 1 else process


def _edge_rows(snapshot: ProfileSnapshot, topology: Topology | None) -> tuple[tuple[_Column, ...], list[list[Text]]]:
    keys = [(e.src, e.dst, e.kind.value) for e in topology.edges] if topology is not None else []
    keys += [key for key in snapshot.edges if key not in keys]
    rows = []
    for key in keys:
        stats = snapshot.edges.get(key)
        transport = stats.transport if stats and stats.transport else _topology_transport(topology, key)
        style = STALE_STYLE if stats is not None and stats.stale else ""
        measured = stats is not None and stats.hops > 0
        rows.append(
            [
                Text(f"{key[0]} → {key[1]}"),
                Text(key[2]),
                Text(transport),
                Text(str(stats.hops) if stats else "0", style=style),
                *(Text(cell, style=style) for cell in _latencies(stats)),
                Text(format_byte_rate(stats.mb_per_s * 1e6) if measured and stats else "-", style=style),
            ]
        )
    return _EDGE_COLUMNS, rows


def _count_cell(value: int) -> Text:
    return Text(str(value), style="bold red" if value else "")


def _fit(
    console: Console, options: ConsoleOptions, title: str, columns: tuple[_Column, ...], rows: list[list[Text]]
) -> Table:
    """The widest table that fits: drop the least useful columns until it does."""
    kept = list(range(len(columns)))
    while True:
        table = _table(title, [columns[i] for i in kept], [[row[i] for i in kept] for row in rows])
        if len(kept) <= 1 or Measurement.get(console, options.update(width=10_000), table).maximum <= options.max_width:
            return table
        kept.remove(min(kept, key=lambda i: columns[i].keep))


def _table(title: str, columns: list[_Column], rows: list[list[Text]]) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        expand=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    for column in columns:
        table.add_column(column.header, justify="right" if column.right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _topology_transport(topology: Topology | None, key: tuple[str, str, str]) -> str:
    if topology is None:
        return "-"
    for edge in topology.edges:
        if (edge.src, edge.dst, edge.kind.value) == key:
            return edge.transport.value
    return "-"


def _latencies(stats: StageStats | EdgeStats | None) -> tuple[str, str]:
    if stats is None:
        return "-", "-"
    n = stats.n if isinstance(stats, StageStats) else stats.hops
    return _enough(stats.p50_s, n, MIN_SAMPLES_P50), _enough(stats.p99_s, n, MIN_SAMPLES_P99)


def _number(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class Dashboard:
    """Keeps the dashboard on screen (``live``) or prints status lines (``lines``).

    ``auto`` picks ``live`` when the console is a terminal, else ``lines``; ``off``
    shows nothing. ``--no-dashboard`` maps to ``lines``: a line stamped with the wall
    clock whenever the figures change, and every ``heartbeat_s`` when they do not.
    """

    def __init__(
        self,
        aggregator: SnapshotSource,
        topology: Topology | None = None,
        live_stats: Callable[[], LiveStats] | None = None,
        console: Console | None = None,
        mode: DashboardMode = "auto",
        refresh_s: float = 0.5,
        status_interval_s: float = 5.0,
        rejected: Callable[[], int] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        where: Sequence[str] = (),
    ) -> None:
        self.aggregator = aggregator
        self.where = tuple(where)  # kept on the first line: the URL, the traces folder
        self.topology = topology
        self.live_stats = live_stats
        self.rejected = rejected
        self.console = console if console is not None else Console()
        self.mode: DashboardMode = ("live" if self.console.is_terminal else "lines") if mode == "auto" else mode
        self.refresh_s = refresh_s
        self.status_interval_s = status_interval_s
        self.heartbeat_s = heartbeat_s
        self._live: Live | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def render(self, max_height: int | None = None) -> RenderableType:
        """``max_height``: the rows it may take; by default, a live dashboard fits the terminal."""
        live = self.live_stats() if self.live_stats is not None else None
        rejected = self.rejected() if self.rejected is not None else None
        if max_height is None and self.mode == "live":
            max_height = self.console.height
        return render_dashboard(self.aggregator.snapshot(), self.topology, live, rejected, max_height, self.where)

    def start(self) -> Dashboard:
        if self.mode == "live":
            self._live = Live(
                console=self.console,
                get_renderable=self.render,
                refresh_per_second=1 / self.refresh_s,
                transient=False,
            )
            self._live.start()
        elif self.mode == "lines":
            self._thread = threading.Thread(target=self._print_lines, name="omnictl-status", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _print_lines(self) -> None:
        previous: tuple[int | None, ...] = ()
        printed_at = 0.0
        while not self._stopping.wait(self.status_interval_s):
            rejected = self.rejected() if self.rejected is not None else None
            snapshot = self.aggregator.snapshot()
            h = snapshot.header
            # Something happened when a count moved; rates and uptime drift on their own.
            counts = (h.in_flight, h.completed, h.failed, h.aborted, rejected, h.dropped_events)
            if counts == previous and time.monotonic() - printed_at < self.heartbeat_s:
                continue
            previous, printed_at = counts, time.monotonic()
            line = f"{time.strftime('%H:%M:%S')} {status_line(snapshot, rejected)}"
            self.console.print(line, soft_wrap=True, highlight=False, markup=False)


def pipeline_live_stats(pipeline: Any, loop: asyncio.AbstractEventLoop) -> Callable[[], LiveStats]:
    """``Pipeline.stats()`` asked from the dashboard's thread of the loop ``pipeline`` runs on."""
    loop_thread: set[int] = set()
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop in this thread
        on_loop = False
    if on_loop:
        loop_thread.add(threading.get_ident())
    else:
        loop.call_soon_threadsafe(lambda: loop_thread.add(threading.get_ident()))

    def live_stats() -> LiveStats:
        # The first render may happen on the loop itself, where waiting would deadlock.
        if threading.get_ident() in loop_thread or not loop.is_running():
            return {}
        try:
            return asyncio.run_coroutine_threadsafe(pipeline.stats(timeout=0.5), loop).result(1.0)
        except TimeoutError:  # a busy server: show the columns as unknown this time
            return {}

    return live_stats
