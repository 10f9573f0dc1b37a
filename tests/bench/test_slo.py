"""Goodput under an audio SLO from the client's receive clock, and where a late chunk waited."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from omnictl.bench.report import build_result, render
from omnictl.bench.slo import AudioSlo, judge, where_late
from omnictl.bench.stats import RequestRecord, continuity_summary
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.store import TraceStore

MS = 1_000_000


def record(index: int, chunks: list[tuple[float, float]], ok: bool = True) -> RequestRecord:
    return RequestRecord(index=index, request_id=f"r{index}", ok=ok, ttfa=chunks[0][0] if chunks else None,
                         e2e=chunks[-1][0] if chunks else 1.0, audio_chunks=chunks,
                         audio_seconds=sum(s for _, s in chunks), last_audio=chunks[-1][0] if chunks else None)


SMOOTH = record(0, [(0.2, 0.5), (0.6, 0.5), (1.0, 0.5)])  # always ahead of the listener
SLOW_START = record(1, [(1.5, 0.5), (1.9, 0.5)])  # first audio after 1.5 s
STUTTER = record(2, [(0.06, 0.2), (0.9, 0.5)])  # 0.2 s of audio runs out at 0.26: a 640 ms wait


def test_the_client_clock_finds_the_gaps_it_received() -> None:
    assert SMOOTH.largest_underrun == 0
    assert STUTTER.largest_underrun == pytest.approx(0.64)
    assert STUTTER.continuity().gaps_over == {50: 1, 100: 1, 250: 1}
    summary = continuity_summary([SMOOTH, SLOW_START, STUTTER])
    assert summary["streams"] == 3 and summary["gaps_over_ms"] == {"50": 1, "100": 1, "250": 1}
    assert summary["continuity"]["100"] == pytest.approx(2 / 3)


def test_goodput_counts_requests_meeting_both_goals() -> None:
    failed = record(3, [], ok=False)
    refused = RequestRecord(index=4, overloaded=True, error="HTTP 429")
    summary, misses = judge([SMOOTH, SLOW_START, STUTTER, failed, refused], AudioSlo(1.0, 0.1), duration=2.0)
    assert summary["met"] == 1 and summary["share"] == pytest.approx(0.2) and summary["goodput_per_s"] == 0.5
    assert summary["missed_by"] == {"ttfp": 1, "underrun": 1, "failed": 1, "refused": 1}
    assert [(m.request_id, m.reason) for m in misses] == [("r1", "ttfp"), ("r2", "underrun")]
    assert misses[1].window == pytest.approx((0.06, 0.9))
    # with only a TTFP goal the stutter passes
    assert judge([STUTTER], AudioSlo(ttfp_s=1.0), 1.0)[0]["met"] == 1


def test_the_late_chunk_is_placed_at_the_stage_that_held_it(tmp_path: Path) -> None:
    t0 = time.time_ns()

    def at(kind: EventKind, ms: float, stage: str | None, process: str, **meta: object) -> Event:
        return Event(kind, "r2", stage, process, t0 + int(ms * MS), meta)  # type: ignore[arg-type]

    events = [
        at(EventKind.ADMITTED, 0, None, "coordinator"),
        at(EventKind.QUEUE_ENTER, 0, "llm", "llm"), at(EventKind.PREFILL_START, 1, "llm", "llm"),
        at(EventKind.PREFILL_END, 10, "llm", "llm"), at(EventKind.DECODE_STEPS, 90, "llm", "llm", steps=9),
        at(EventKind.STAGE_DONE, 100, "llm", "llm"),
        at(EventKind.QUEUE_ENTER, 20, "tts", "tts"), at(EventKind.COMPUTE_START, 20, "tts", "tts", phase="synthesis"),
        at(EventKind.COMPUTE_END, 60, "tts", "tts", phase="synthesis"),
        at(EventKind.FIRST_AUDIO, 60, "tts", "coordinator"),
        # the second sentence waits in the queue behind another stream, then synthesises slowly
        at(EventKind.QUEUE_ENTER, 100, "tts", "tts"), at(EventKind.COMPUTE_START, 300, "tts", "tts", phase="synthesis"),
        at(EventKind.COMPUTE_END, 900, "tts", "tts", phase="synthesis"), at(EventKind.STAGE_DONE, 900, "tts", "tts"),
        at(EventKind.COMPLETED, 950, None, "coordinator"),
    ]
    store = TraceStore(tmp_path)
    store.append(events)
    store.close()
    _, misses = judge([STUTTER], AudioSlo(underrun_s=0.1), 1.0)
    (placed,) = where_late(tmp_path, misses, wait_s=0)
    assert placed["stage"] == "tts" and placed["part"] == "synthesis"
    assert placed["seconds"] == pytest.approx(0.6, abs=0.01)  # 300..900 ms, inside the 60..900 ms wait

    result = build_result({"target": "t"}, [SMOOTH, STUTTER], 2.0, None,
                          {**judge([SMOOTH, STUTTER], AudioSlo(1.0, 0.1), 2.0)[0], "missed": [placed]})
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(render(result))
    text = console.export_text()
    assert "audio continuity" in text and "largest underrun" in text
    line = next(line for line in text.splitlines() if " r2 " in line)
    assert "underrun" in line and "tts" in line and "synthesis" in line and "600.0" in line
