"""Dashboard rendering (into a fixed-size Rich console) and the plain status line."""

from __future__ import annotations

import io
import threading
import time

from rich.console import Console

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.dashboard import Dashboard, render_dashboard, status_line
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.synthetic import qwen_omni_topology, synthetic_request

S = 1_000_000_000
TOPOLOGY = qwen_omni_topology()


def _render(renderable: object, width: int = 140) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _aggregator(now: int) -> Aggregator:
    aggregator = Aggregator(window_s=10)
    for index in range(4):
        aggregator.add(synthetic_request(f"r{index}", TOPOLOGY, start_ns=now - (5 - index) * S))
    aggregator.add([Event(EventKind.ADMITTED, "pending", None, "coordinator", now - S)])
    aggregator.add([Event(EventKind.FAILED, "bad", "thinker", "coordinator", now - S)])
    return aggregator


def _row(text: str, first_cell: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.strip("│┃ ").startswith(first_cell + " "))
    return [cell.strip() for cell in line.replace("┃", "│").split("│") if cell.strip()]


def test_header_stage_and_edge_rows() -> None:
    now = time.time_ns()
    snapshot = _aggregator(now).snapshot(now)
    # The shape of `Pipeline.stats()`.
    live: dict[str, dict[str, object]] = {
        "thinker": {"status": "up", "process": "thinker", "requests": 2, "queued": 3, "running": 1},
        "talker": {"status": "up", "process": "talker", "requests": 0, "queued": 0, "running": 4},
        "code2wav": {"status": "down", "process": "talker"},
    }
    text = _render(render_dashboard(snapshot, TOPOLOGY, live))
    assert "omnictl · qwen-omni" in text
    assert "in flight 1" in text and "completed 4" in text and "failed 1" in text and "aborted 0" in text
    assert "1.0 req/s" in text  # 5 requests ended in the 5 s since the first event
    assert "time to first text p50 18.30 ms" in text and "first audio p50 30.45 ms" in text
    # stage, process, gpu, in flight, queue, batch, items/s, p50, p99, share
    assert _row(text, "thinker")[:7] == ["thinker", "thinker", "0", "2", "3", "1", "0.8"]
    # batch: the scheduler's reported batch_size wins over the runtime's `running` count
    assert _row(text, "talker")[:6] == ["talker", "talker", "1", "0", "0", "1"]
    assert _row(text, "code2wav (down)")[:2] == ["code2wav (down)", "talker"]
    assert _row(text, "decode")[4] == "-", "no runtime figure: no queue depth"
    assert _row(text, "preprocessing")[:3] == ["preprocessing", "preprocess", "cpu"]
    stream = next(line for line in text.splitlines() if "thinker → talker" in line and "stream" in line)
    assert "relay" in stream and "800 µs" in stream


def test_stages_without_events_still_get_a_row() -> None:
    now = time.time_ns()
    text = _render(render_dashboard(Aggregator().snapshot(now), TOPOLOGY, {"thinker": {"running": 3}}))
    for stage in TOPOLOGY.stages:
        assert _row(text, stage)[0] == stage
    assert _row(text, "thinker")[5] == "3", "without batch_size events, the runtime's running count"
    assert "in flight 0" in text and "p50 -" in text


def test_dropped_events_are_shown() -> None:
    now = time.time_ns()
    aggregator = Aggregator()
    aggregator.add([Event(EventKind.DROPPED, "", None, "talker", now, {"count": 7})])
    assert "dropped events 7" in _render(render_dashboard(aggregator.snapshot(now), TOPOLOGY))
    assert "dropped events 7" in status_line(aggregator.snapshot(now))


def test_status_line() -> None:
    now = time.time_ns()
    line = status_line(_aggregator(now).snapshot(now))
    assert line.startswith("up 0m05s | in flight 1 | done 4 failed 1 aborted 0 | 1.0 req/s | TTFT p50 18.30 ms")
    assert "\n" not in line


def test_without_a_terminal_the_dashboard_prints_status_lines() -> None:
    now = time.time_ns()
    out = io.StringIO()
    console = Console(file=out, width=200)  # a StringIO is not a terminal
    dashboard = Dashboard(_aggregator(now), TOPOLOGY, console=console, status_interval_s=0.05)
    assert dashboard.mode == "lines"
    with dashboard:
        deadline = time.monotonic() + 10
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.02)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("up ") for line in lines)


def test_on_a_terminal_the_dashboard_is_live() -> None:
    now = time.time_ns()
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True)
    calls: list[int] = []

    def live_stats() -> dict[str, dict[str, float]]:
        calls.append(1)
        return {"thinker": {"queued": 5}}

    dashboard = Dashboard(_aggregator(now), TOPOLOGY, live_stats=live_stats, console=console, refresh_s=0.05)
    assert dashboard.mode == "live"
    with dashboard:
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.02)
    assert len(calls) >= 2, "the live view refreshes"
    assert "code2wav" in out.getvalue()
    assert Dashboard(Aggregator(), console=console, mode="off").start().mode == "off"


def test_a_replicated_process_shows_its_replicas_and_a_degraded_stage() -> None:
    import dataclasses

    processes = dict(TOPOLOGY.processes)
    processes["talker"] = dataclasses.replace(processes["talker"], replicas=2)
    topology = dataclasses.replace(TOPOLOGY, processes=processes)
    now = time.time_ns()
    live = {"code2wav": {"status": "degraded", "process": "talker", "requests": 1}}
    text = _render(render_dashboard(Aggregator().snapshot(now), topology, live), width=160)
    assert _row(text, "code2wav (degraded)")[:2] == ["code2wav (degraded)", "talker#0,talker#1"]
    assert _row(text, "thinker")[1] == "thinker"
