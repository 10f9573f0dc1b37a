"""The live dashboard (Rich Live) that `serve` and `bench` show, and its plain fallback.

``render_dashboard`` turns a :class:`ProfileSnapshot` into a Rich renderable: a header
(uptime, in flight, outcomes, req/s, time to first text and audio), a row per stage and a
row per edge. ``Dashboard`` keeps it on screen while a run lasts; without a terminal it
prints :func:`status_line` every few seconds instead.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Literal, Mapping

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from omnictl.profiling.aggregate import EdgeStats, ProfileSnapshot, StageStats
from omnictl.profiling.stats import SnapshotSource
from omnictl.profiling.units import format_rate, format_seconds
from omnictl.topology.model import Topology

# Per-stage figures only the runtime knows: `Pipeline.stats()` as it is, i.e.
# stage -> {"status": "up"|"degraded"|"down"|"unknown", "requests": n, "queued": n, "running": n, ...};
# any key may be missing. "requests" shows as in flight, "queued" as the queue depth, and
# "running" as the batch size unless the scheduler reports `batch_size` in its events.
LiveStats = Mapping[str, Mapping[str, Any]]
DashboardMode = Literal["auto", "live", "lines", "off"]


def render_dashboard(
    snapshot: ProfileSnapshot,
    topology: Topology | None = None,
    live: LiveStats | None = None,
) -> RenderableType:
    return Group(_header(snapshot, topology), _stage_table(snapshot, topology, live or {}), _edge_table(snapshot, topology))


def status_line(snapshot: ProfileSnapshot) -> str:
    """One line for logs and non-terminals."""
    h = snapshot.header
    line = (
        f"up {_uptime(h.uptime_s)} | in flight {h.in_flight} | done {h.completed} failed {h.failed} "
        f"aborted {h.aborted} | {format_rate(h.requests_per_s)} req/s | "
        f"TTFT p50 {format_seconds(h.ttft_p50_s)} p99 {format_seconds(h.ttft_p99_s)} | "
        f"first audio p50 {format_seconds(h.ttfa_p50_s)} p99 {format_seconds(h.ttfa_p99_s)}"
    )
    return line + (f" | dropped events {h.dropped_events}" if h.dropped_events else "")


def _header(snapshot: ProfileSnapshot, topology: Topology | None) -> Text:
    h = snapshot.header
    title = f"omnictl · {topology.name}" if topology is not None else "omnictl"
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(title, style="bold")
    text.append(
        f"  up {_uptime(h.uptime_s)}  in flight {h.in_flight}  completed {h.completed}  "
        f"failed {h.failed}  aborted {h.aborted}  {format_rate(h.requests_per_s)} req/s\n"
    )
    text.append(
        f"time to first text p50 {format_seconds(h.ttft_p50_s)} p99 {format_seconds(h.ttft_p99_s)}  ·  "
        f"first audio p50 {format_seconds(h.ttfa_p50_s)} p99 {format_seconds(h.ttfa_p99_s)}  ·  "
        f"window {snapshot.window_s:g} s"
    )
    if h.dropped_events:
        text.append(f"  ·  dropped events {h.dropped_events}", style="bold red")
    return text


def _stage_table(snapshot: ProfileSnapshot, topology: Topology | None, live: LiveStats) -> Table:
    table = Table(title="stages", title_justify="left", expand=False)
    for column in ("stage", "process", "gpu"):
        table.add_column(column, no_wrap=True)
    for column in ("in flight", "queue", "batch", "items/s", "p50", "p99", "share"):
        table.add_column(column, justify="right", no_wrap=True)
    names = list(topology.stages) if topology is not None else []
    names += [name for name in snapshot.stages if name not in names]
    for name in names:
        stats = snapshot.stages.get(name)
        runtime = live.get(name, {})
        spec = topology.stages.get(name) if topology is not None else None
        process = _process_label(topology, spec.process) if spec is not None else (stats.process if stats else "-")
        gpu = (",".join(str(g) for g in spec.gpu) or "cpu") if spec is not None else "-"
        in_flight = runtime.get("requests", stats.in_flight if stats else None)
        batch = stats.batch_size if stats and stats.batch_size is not None else runtime.get("running")
        status = runtime.get("status")
        table.add_row(
            Text(f"{name} ({status})", style="bold red") if status in ("down", "degraded") else name,
            process,
            gpu,
            _number(in_flight),
            _number(runtime.get("queued")),
            _number(batch),
            format_rate(stats.items_per_s) if stats else "-",
            *_latencies(stats),
            f"{stats.share:.0%}" if stats and stats.share is not None else "-",
        )
    return table


def _process_label(topology: Topology | None, process: str) -> str:
    """The process, or its replicas' names (``tts#0,tts#1``) when it has several."""
    spec = topology.processes.get(process) if topology is not None else None
    return ",".join(spec.instances) if spec is not None and spec.replicas > 1 else process


def _edge_table(snapshot: ProfileSnapshot, topology: Topology | None) -> Table:
    table = Table(title="edges", title_justify="left", expand=False)
    for column in ("edge", "kind", "transport"):
        table.add_column(column, no_wrap=True)
    for column in ("hops", "p50", "p99", "MB/s"):
        table.add_column(column, justify="right", no_wrap=True)
    keys = [(e.src, e.dst, e.kind.value) for e in topology.edges] if topology is not None else []
    keys += [key for key in snapshot.edges if key not in keys]
    for key in keys:
        stats = snapshot.edges.get(key)
        transport = stats.transport if stats and stats.transport else _topology_transport(topology, key)
        table.add_row(
            f"{key[0]} → {key[1]}",
            key[2],
            transport,
            str(stats.hops) if stats else "0",
            *_latencies(stats),
            f"{stats.mb_per_s:.2f}" if stats else "-",
        )
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
    return format_seconds(stats.p50_s), format_seconds(stats.p99_s)


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
    shows nothing. ``--no-dashboard`` maps to ``lines``.
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
    ) -> None:
        self.aggregator = aggregator
        self.topology = topology
        self.live_stats = live_stats
        self.console = console if console is not None else Console()
        self.mode: DashboardMode = ("live" if self.console.is_terminal else "lines") if mode == "auto" else mode
        self.refresh_s = refresh_s
        self.status_interval_s = status_interval_s
        self._live: Live | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def render(self) -> RenderableType:
        live = self.live_stats() if self.live_stats is not None else None
        return render_dashboard(self.aggregator.snapshot(), self.topology, live)

    def start(self) -> "Dashboard":
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

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _print_lines(self) -> None:
        while not self._stopping.wait(self.status_interval_s):
            self.console.print(status_line(self.aggregator.snapshot()), soft_wrap=True, highlight=False)
