"""Dashboard rendering (into fixed-size Rich consoles) and the plain status lines."""

from __future__ import annotations

import io
import re
import threading
import time

import pytest
from rich.console import Console

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.dashboard import Dashboard, render_dashboard, status_line
from omnictl.profiling.events import Event, EventKind
from tests.support.synthetic import qwen_omni_topology, synthetic_request

S = 1_000_000_000
TOPOLOGY = qwen_omni_topology()
# a figure with its unit, a rate, a count, a percentage, or "-": what a latency / rate cell may hold
NUMBER_CELL = re.compile(r"^(-|\d+(\.\d+)? (µs|ms|s|B/s|kB/s|MB/s|GB/s)|\d+(\.\d+)?|\d+%)$")


def _render(renderable: object, width: int = 140) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _aggregator(now: int, requests: int = 4) -> Aggregator:
    aggregator = Aggregator(window_s=10)
    for index in range(requests):
        aggregator.add(synthetic_request(f"r{index}", TOPOLOGY, start_ns=now - (5 - index * 4 / requests) * S))
    aggregator.add([Event(EventKind.ADMITTED, "pending", None, "coordinator", now - S)])
    aggregator.add([Event(EventKind.ADMITTED, "bad", None, "coordinator", now - S)])
    aggregator.add([Event(EventKind.FAILED, "bad", "thinker", "coordinator", now - S, {"error": "boom"})])
    aggregator.add([Event(EventKind.ADMITTED, "odd", None, "coordinator", now - S)])
    aggregator.add([Event(EventKind.FAILED, "odd", "talker", "coordinator", now - S, {"error": "x", "rejected": True})])
    return aggregator


def _cells(line: str) -> list[str]:
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def _table(text: str, title: str) -> tuple[list[str], dict[str, list[str]]]:
    """(header cells, first cell -> the row's cells) of one dashboard table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    header = _cells(lines[start + 1])
    rows: dict[str, list[str]] = {}
    for line in lines[start + 3:]:
        if not line.strip() or line.strip() in ("stages", "edges") or line.startswith("…"):
            break
        cells = _cells(line)
        rows[cells[0]] = cells
    return header, rows


def _column(text: str, title: str, first_cell: str, column: str) -> str:
    header, rows = _table(text, title)
    return dict(zip(header, rows[first_cell]))[column]


def test_header_stage_and_edge_rows() -> None:
    now = time.time_ns()
    snapshot = _aggregator(now, requests=12).snapshot(now)
    live: dict[str, dict[str, object]] = {  # the shape of `Pipeline.stats()`
        "thinker": {"status": "up", "process": "thinker", "requests": 2, "queued": 3, "running": 1},
        "talker": {"status": "up", "process": "talker", "requests": 0, "queued": 0, "running": 4},
        "code2wav": {"status": "down", "process": "talker"},
    }
    text = _render(render_dashboard(snapshot, TOPOLOGY, live, rejected=3), width=160)
    assert "omnictl · qwen-omni" in text
    assert "in flight 1" in text and "completed 12" in text and "failed 2" in text and "aborted 0" in text
    assert "rejected 3" in text, "the server's 4xx count"
    assert "2.8 req/s" in text  # 14 requests ended in the 5 s since the first event
    assert "first text p50 18.30 ms p99 18.30 ms (n=12)" in text
    header, rows = _table(text, "stages")
    assert header == ["stage", "process", "gpu", "in flight", "queue", "batch", "items/s", "n", "p50", "p99",
                      "share", "failed", "rejected"]
    thinker = dict(zip(header, rows["thinker"]))
    assert [thinker[c] for c in ("process", "gpu", "in flight", "queue", "batch", "items/s", "n")] == [
        "thinker", "0", "2", "3", "1", "2.4", "12"]
    assert (thinker["failed"], thinker["rejected"]) == ("1", "0")
    talker = dict(zip(header, rows["talker"]))
    assert talker["batch"] == "1", "the scheduler's reported batch_size wins over the runtime's running count"
    assert (talker["failed"], talker["rejected"]) == ("0", "1")
    assert rows["code2wav (down)"][1] == "talker"
    assert dict(zip(header, rows["decode"]))["queue"] == "-", "no runtime figure: no queue depth"
    assert rows["preprocessing"][:3] == ["preprocessing", "preprocess", "cpu"]
    stream = next(line for line in text.splitlines() if "thinker → talker" in line and "stream" in line)
    assert "relay" in stream and "800 µs" in stream


def test_share_is_each_stages_part_of_all_stage_time_and_sums_to_100() -> None:
    now = time.time_ns()
    snapshot = _aggregator(now, requests=12).snapshot(now)
    shares = [s.share for s in snapshot.stages.values() if s.share is not None]
    assert sum(shares) == pytest.approx(1.0)
    text = _render(render_dashboard(snapshot, TOPOLOGY), width=160)
    shown = [int(_column(text, "stages", name, "share").rstrip("%")) for name in TOPOLOGY.stages]
    assert 97 <= sum(shown) <= 103  # rounded percentages


def test_percentiles_show_n_and_a_dash_until_there_are_enough_samples() -> None:
    now = time.time_ns()
    text = _render(render_dashboard(_aggregator(now, requests=2).snapshot(now), TOPOLOGY), width=160)
    assert "first text p50 - p99 - (n=2)" in text
    assert _column(text, "stages", "thinker", "n") == "2"
    assert _column(text, "stages", "thinker", "p50") == "-"
    text = _render(render_dashboard(_aggregator(now, requests=4).snapshot(now), TOPOLOGY), width=160)
    assert _column(text, "stages", "thinker", "p50").endswith(" ms")
    assert _column(text, "stages", "thinker", "p99") == "-", "p99 of 4 samples is not shown"


@pytest.mark.parametrize("width", [80, 100])
def test_at_narrow_widths_columns_go_before_any_figure_is_cut(width: int) -> None:
    now = time.time_ns()
    live = {"thinker": {"requests": 2, "queued": 3, "running": 1}}
    text = _render(render_dashboard(_aggregator(now, requests=12).snapshot(now), TOPOLOGY, live, rejected=0), width)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    assert "req/s" in text and "rejected 0" in text and "first audio p50" in text
    for title in ("stages", "edges"):
        header, rows = _table(text, title)
        assert {"p50", "n" if title == "stages" else "hops"} <= set(header)
        for name, cells in rows.items():
            assert len(cells) == len(header), f"{title} row {name!r} lost a cell: {cells}"
            row = dict(zip(header, cells))
            for column in ("p50", "p99", "items/s", "share", "rate"):
                if column in row:
                    assert NUMBER_CELL.match(row[column]), f"{name} {column} {row[column]!r}"
    header, _ = _table(text, "stages")
    assert {"stage", "in flight", "failed"} <= set(header)


def test_replica_process_names_are_shown_as_they_are() -> None:
    now = time.time_ns()
    aggregator = Aggregator()
    aggregator.add([Event(EventKind.INPUT_RECEIVED, "r", "tts", "tts#1", now - S),
                    Event(EventKind.STAGE_DONE, "r", "tts", "tts#1", now),
                    Event(EventKind.INPUT_RECEIVED, "q", "tts#0", "tts#0", now - S)])
    text = _render(render_dashboard(aggregator.snapshot(now)), width=140)
    rows = _table(text, "stages")[1]
    assert rows["tts"][:2] == ["tts", "tts#1"] and rows["tts#0"][:3] == ["tts#0", "tts#0", "-"]
    assert "tts#0" in _table(_render(render_dashboard(aggregator.snapshot(now)), width=80), "stages")[1]


def test_an_idle_dashboard_shows_the_last_windows_figures() -> None:
    now = time.time_ns()
    aggregator = _aggregator(now, requests=12)
    fresh = aggregator.snapshot(now)
    idle = aggregator.snapshot(now + 60 * S)  # two windows later: nothing new
    assert idle.header.stale and idle.stages["thinker"].stale
    assert idle.stages["thinker"].p50_s == fresh.stages["thinker"].p50_s
    text = _render(render_dashboard(idle, TOPOLOGY), width=160)
    assert "idle: last window's figures" in text
    assert _column(text, "stages", "thinker", "p50") == _column(_render(render_dashboard(fresh, TOPOLOGY), width=160),
                                                                "stages", "thinker", "p50")
    console = Console(width=160, file=io.StringIO(), force_terminal=True, color_system="standard")
    console.print(render_dashboard(idle, TOPOLOGY))
    assert "\x1b[2m" in console.file.getvalue(), "greyed (dim)"  # type: ignore[attr-defined]


def test_stages_without_events_still_get_a_row() -> None:
    now = time.time_ns()
    text = _render(render_dashboard(Aggregator().snapshot(now), TOPOLOGY, {"thinker": {"running": 3}}))
    header, rows = _table(text, "stages")
    assert set(rows) == set(TOPOLOGY.stages)
    thinker = dict(zip(header, rows["thinker"]))
    assert thinker["batch"] == "3", "without batch_size events, the runtime's running count"
    assert (thinker["in flight"], thinker["n"], thinker["p50"], thinker["items/s"]) == ("0", "0", "-", "-")
    assert "in flight 0" in text and "p50 -" in text


def test_dropped_events_are_shown() -> None:
    now = time.time_ns()
    aggregator = Aggregator()
    aggregator.add([Event(EventKind.DROPPED, "", None, "talker", now, {"count": 7})])
    assert "dropped events 7" in _render(render_dashboard(aggregator.snapshot(now), TOPOLOGY))
    assert "dropped events 7" in status_line(aggregator.snapshot(now))


def test_status_line() -> None:
    now = time.time_ns()
    line = status_line(_aggregator(now).snapshot(now), rejected=2)
    assert line.startswith("up 0m05s | in flight 1 | completed 4 failed 2 aborted 0 rejected 2 | 1.2 req/s | "
                           "first text p50 18.30 ms p99 - (n=4)")
    assert "\n" not in line


def test_status_lines_carry_the_time_and_are_printed_when_something_changes() -> None:
    now = time.time_ns()
    aggregator = _aggregator(now)
    out = io.StringIO()
    console = Console(file=out, width=200)  # a StringIO is not a terminal
    dashboard = Dashboard(aggregator, TOPOLOGY, console=console, status_interval_s=0.02)
    assert dashboard.mode == "lines"
    with dashboard:
        time.sleep(0.3)  # ~15 intervals with nothing new: one line
        aggregator.add([Event(EventKind.ADMITTED, "late", None, "coordinator", time.time_ns())])
        deadline = time.monotonic() + 10
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        time.sleep(0.1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert all(re.match(r"\d\d:\d\d:\d\d up ", line) for line in lines)
    assert "in flight 1" in lines[0] and "in flight 2" in lines[1]


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


def test_at_80x24_the_dashboard_fits_and_says_what_it_left_out() -> None:
    now = time.time_ns()
    snapshot = _aggregator(now, requests=12).snapshot(now)
    text = _render(render_dashboard(snapshot, TOPOLOGY, rejected=0, max_height=24), width=80)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    hidden = re.search(r"… (\d+) more edges", text)
    assert hidden, text
    shown = sum(1 for line in lines if " → " in line)
    assert shown + int(hidden.group(1)) == len(snapshot.edges)
    assert set(_table(text, "stages")[1]) == set(TOPOLOGY.stages), "every stage keeps its row"
    tall = _render(render_dashboard(snapshot, TOPOLOGY, max_height=60), width=80)
    assert "more edges" not in tall and sum(1 for line in tall.splitlines() if " → " in line) == len(snapshot.edges)


def test_live_stats_come_from_the_pipelines_loop_and_never_block_it() -> None:
    import asyncio

    from omnictl.profiling.dashboard import pipeline_live_stats

    class Pipeline:
        async def stats(self, timeout: float) -> dict[str, dict[str, int]]:
            return {"thinker": {"queued": 4}}

    async def main() -> tuple[float, object, object]:
        live_stats = pipeline_live_stats(Pipeline(), asyncio.get_running_loop())
        started = time.monotonic()
        on_loop = live_stats()  # the first render runs on the loop itself: it must not wait
        waited = time.monotonic() - started
        from_thread = await asyncio.to_thread(live_stats)
        return waited, on_loop, from_thread

    waited, on_loop, from_thread = asyncio.run(main())
    assert on_loop == {} and waited < 0.5
    assert from_thread == {"thinker": {"queued": 4}}


def test_a_replicated_process_shows_its_replicas_and_a_degraded_stage() -> None:
    import dataclasses

    processes = dict(TOPOLOGY.processes)
    processes["talker"] = dataclasses.replace(processes["talker"], replicas=2)
    topology = dataclasses.replace(TOPOLOGY, processes=processes)
    now = time.time_ns()
    live = {"code2wav": {"status": "degraded", "process": "talker", "requests": 1}}
    text = _render(render_dashboard(Aggregator().snapshot(now), topology, live), width=160)
    rows = _table(text, "stages")[1]
    assert rows["code2wav (degraded)"][:2] == ["code2wav (degraded)", "talker#0,talker#1"]
    assert rows["thinker"][1] == "thinker"


def test_the_status_line_and_the_dashboard_speak_one_vocabulary() -> None:
    now = time.time_ns()
    snapshot = _aggregator(now).snapshot(now)
    line = status_line(snapshot)
    board = _render(render_dashboard(snapshot, TOPOLOGY), width=200)
    for word in ("completed", "failed", "aborted", "first text", "first audio", "in flight"):
        assert word in line and word in board, word
    assert "TTFT" not in line and "done " not in line


def test_at_80x24_the_first_line_keeps_the_url_and_the_traces_folder() -> None:
    now = time.time_ns()
    runs = "/home/someone/.local/state/omnictl/runs/20261201-221351-17722"
    view = render_dashboard(_aggregator(now, requests=12).snapshot(now), TOPOLOGY, rejected=0, max_height=24,
                            where=("http://127.0.0.1:8000", f"traces {runs}"))
    lines = _render(view, width=80).splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    assert lines[0].startswith("http://127.0.0.1:8000  traces …") and lines[0].endswith("20261201-221351-17722")


def test_edge_rates_pick_their_unit_by_size() -> None:
    from omnictl.profiling.units import format_byte_rate

    assert [format_byte_rate(v) for v in (0, 880, 3_400, 12_000_000, 1.25e9, 3.2e12)] == [
        "0 B/s", "880 B/s", "3.40 kB/s", "12.0 MB/s", "1.25 GB/s", "3200.0 GB/s"]
    now = time.time_ns()
    _, rows = _table(_render(render_dashboard(_aggregator(now, requests=12).snapshot(now), TOPOLOGY), width=160), "edges")
    rates = [cells[-1] for cells in rows.values()]
    assert any(rate not in ("-", "0 B/s") for rate in rates) and not any(rate == "0.00" for rate in rates), rates


def test_the_header_shows_each_elastic_process_s_running_replicas_from_the_live_stats() -> None:
    from omnictl.topology import loads

    topology = loads("""
stages:
  - {name: a, factory: m.a, next: [work]}
  - {name: work, factory: m.w, terminal: true}
processes:
  work: {replicas: {min: 1, max: 4}}
""")
    now = 100 * S
    snapshot = _aggregator(now).snapshot(now)
    statuses = {"work#0": "up", "work#1": "up", "work#2": "down", "work#3": "standby"}
    live = {"work": {"status": "degraded", "replicas": {n: {"status": st} for n, st in statuses.items()}}}
    assert "work replicas 2 (1-4)" in _render(render_dashboard(snapshot, topology, live), width=200)
    assert "work replicas ? (1-4)" in _render(render_dashboard(snapshot, topology), width=200)


def test_a_tensor_parallel_stage_is_one_row_showing_its_ranks() -> None:
    from omnictl.profiling.dashboard import _placement_label
    from omnictl.topology import loads

    topology = loads(
        "stages:\n  - {name: a, factory: m.a, next: [b], tp_size: 3}\n"
        "  - {name: b, factory: m.b, next: [c], gpu: [0, 1]}\n  - {name: c, factory: m.c, terminal: true}\n"
    )
    assert [_placement_label(s) for s in topology.stages.values()] == ["cpu x3", "0,1", "cpu"]
