"""The text waterfall and the JSON form of one request."""

from __future__ import annotations

import io
import json

import pytest

from rich.console import Console

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.spans import build_trace
from tests.support.synthetic import qwen_omni_topology, synthetic_request
from omnictl.profiling.trace_render import NAME_WIDTH, render_waterfall, trace_to_json

MS = 1_000_000
TOPOLOGY = qwen_omni_topology()


def _text(trace_events: list[Event], width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_waterfall(build_trace("req-1", trace_events), width=width))
    return console.export_text()


def _bar(text: str, row: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(f"{row:<{NAME_WIDTH}} |"))
    return line[NAME_WIDTH + 2 : line.rindex("|")]


def test_waterfall_fits_80_columns_with_one_row_per_stage() -> None:
    text = _text(synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "request req-1  completed  38.00 ms"
    for stage in TOPOLOGY.stages:
        assert len(_bar(text, stage)) == len(_bar(text, "request"))


def test_segments_marks_and_hops() -> None:
    text = _text(synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS))
    assert "~" in _bar(text, "mm_aggregate"), "fan-in wait"
    thinker = _bar(text, "thinker")
    assert "P" in thinker and "=" in thinker and thinker.index("P") < thinker.index("=")
    request_bar = _bar(text, "request")
    assert request_bar.index("T") < request_bar.index("A"), "text arrives before audio"
    assert "first text at decode +18.30 ms; first audio at code2wav +30.45 ms" in text
    assert ">" in _bar(text, "talker"), "hop arrivals are marked"
    hop_line = next(line for line in text.splitlines() if line.strip().startswith("thinker → talker ") and "stream" not in line)
    assert "relay" in hop_line and "800 µs" in hop_line and "64.0 KB" in hop_line
    stream_line = next(line for line in text.splitlines() if "thinker → decode (stream)" in line)
    assert "3 chunks" in stream_line


def test_segments_sit_where_their_time_is() -> None:
    # One stage, 100 ms request: build covers exactly the middle half of the bar.
    events = [
        Event(EventKind.ADMITTED, "req-1", None, "coordinator", 0),
        Event(EventKind.QUEUE_ENTER, "req-1", "only", "p", 0),
        Event(EventKind.BUILD_START, "req-1", "only", "p", 25 * MS),
        Event(EventKind.BUILD_END, "req-1", "only", "p", 75 * MS),
        Event(EventKind.STAGE_DONE, "req-1", "only", "p", 100 * MS),
        Event(EventKind.COMPLETED, "req-1", None, "coordinator", 100 * MS),
    ]
    bar = _bar(_text(events), "only")
    for column, char in enumerate(bar):
        start, end = column / len(bar), (column + 1) / len(bar)  # the time this column covers
        expected = ":" if end <= 0.25 else "b" if 0.25 <= start and end <= 0.75 else "-" if start >= 0.75 else char
        assert char == expected, f"column {column} of {bar!r}"
    assert bar.count("b") >= len(bar) // 2 - 1


def test_a_narrow_terminal_still_fits() -> None:
    text = _text(synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS), width=60)
    assert max(len(line) for line in text.splitlines()) <= 60


def test_json_has_events_and_spans() -> None:
    events = synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS)
    document = json.loads(json.dumps(trace_to_json(build_trace("req-1", events))))
    assert document["request_id"] == "req-1" and document["status"] == "completed"
    assert len(document["events"]) == len(events)
    assert document["spans"][0]["kind"] == "request"
    kinds = {span["kind"] for span in document["spans"]}
    assert {"stage", "queue", "build", "prefill", "decode", "fanin_wait", "hop", "stream", "mark"} <= kinds
    assert all(span["duration_ns"] >= 0 for span in document["spans"])


def test_a_failed_request_shows_where_it_failed() -> None:
    events = [e for e in synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS) if e.ts < 1000 * MS + 12 * MS]
    events.append(Event(EventKind.FAILED, "req-1", "thinker", "coordinator", 1000 * MS + 12 * MS, {"error": "boom"}))
    text = _text(events)
    assert text.splitlines()[0] == "request req-1  failed  12.00 ms"
    assert _bar(text, "request").endswith("X")
    assert "failed at thinker +12.00 ms" in text
    assert not any(line.startswith("code2wav") for line in text.splitlines()), "stages it never reached have no row"


def test_hop_columns_line_up_whatever_the_figures() -> None:
    text = _text(synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS, chunks=12), width=100)
    lines = text.splitlines()
    start = lines.index("hops:")
    hops = [line for line in lines[start + 1:] if line.startswith("  ") and "→" in line]
    assert any("12 chunks, max" in line for line in hops)
    transports = {next(i for i, _ in enumerate(line) if line[i:].startswith(("relay", "inproc", "shm", "cuda_ipc")))
                  for line in hops}
    assert len(transports) == 1, "the transport column starts at one place"
    assert len({len(line) for line in hops}) == 1, "the right-aligned figures end at one place"


def test_a_named_compute_phase_is_painted_and_listed() -> None:
    events = [
        Event(EventKind.ADMITTED, "req-1", None, "coordinator", 0),
        Event(EventKind.QUEUE_ENTER, "req-1", "tts", "p", 0),
        Event(EventKind.COMPUTE_START, "req-1", "tts", "p", 10 * MS, {"phase": "synthesis"}),
        Event(EventKind.COMPUTE_END, "req-1", "tts", "p", 40 * MS, {"phase": "synthesis"}),
        Event(EventKind.COMPUTE_START, "req-1", "tts", "p", 50 * MS, {"phase": "synthesis"}),
        Event(EventKind.COMPUTE_END, "req-1", "tts", "p", 90 * MS, {"phase": "synthesis"}),
        Event(EventKind.STAGE_DONE, "req-1", "tts", "p", 100 * MS),
        Event(EventKind.COMPLETED, "req-1", None, "coordinator", 100 * MS),
    ]
    text = _text(events)
    bar = _bar(text, "tts")
    assert bar.count("#") >= 0.6 * len(bar), bar  # 70 of the 100 ms
    assert "phases (#): synthesis at tts 70.00 ms" in text
    spans = [s for s in build_trace("req-1", events).spans if s.kind == "compute"]
    assert [(s.name, s.duration_ns) for s in spans] == [("synthesis", 30 * MS), ("synthesis", 40 * MS)]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_rows_are_exactly_the_width_before_any_terminal_wraps_or_crops_them(width: int) -> None:
    # Checked on the Text itself: a console would crop or wrap an over-wide line to fit.
    lines = render_waterfall(build_trace("req-1", synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS)),
                             width=width).plain.splitlines()
    rows = [line for line in lines if line[NAME_WIDTH:NAME_WIDTH + 2] == " |"]
    assert len(rows) == 1 + len(TOPOLOGY.stages)  # the request, then one per stage
    assert {len(row) for row in rows} == {width}, rows
    assert max(len(line) for line in lines) <= width


def test_an_underrun_is_marked_on_the_request_row_and_listed() -> None:
    events = synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS)  # 38 ms long
    # the late chunk left at +30 ms after the listener had waited 10 ms (from +20 ms)
    events.append(Event(EventKind.UNDERRUN, "req-1", None, "server", 1030 * MS,
                        {"seconds": 0.010, "chunk": 3, "endpoint": "/v1/chat/completions"}))
    text = _text(events)
    bar = _bar(text, "request")
    marked = [i for i, char in enumerate(bar) if char == "!"]
    # 10 ms of 38 ms on the axis: from column 20/38 of the bar to 30/38
    assert marked and abs(marked[0] - len(bar) * 20 / 38) <= 1 and abs(marked[-1] + 1 - len(bar) * 30 / 38) <= 1
    line = next(line for line in text.splitlines() if line.startswith("underruns (!)"))
    assert "1, 10.00 ms in all" in line and "+20.00 ms waited 10.00 ms (chunk 3)" in line
    assert "underrun" not in _text(synthetic_request("req-1", TOPOLOGY, start_ns=1000 * MS)).split("legend")[0]
    spans = [s for s in trace_to_json(build_trace("req-1", events))["spans"] if s["kind"] == "underrun"]
    assert spans[0]["duration_ns"] == 10 * MS
