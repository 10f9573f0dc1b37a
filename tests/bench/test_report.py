from __future__ import annotations

from typing import Any

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from omnictl.bench.report import build_result, compare, load_result, render
from omnictl.bench.stats import RequestRecord


def result(ttft: float, rate: float | None) -> dict[str, Any]:
    records = [RequestRecord(index=i, ok=True, request_id=f"r{i}", ttft=ttft, e2e=ttft * 4, output_tokens=10,
                             itl=[0.01], ttfa=ttft * 2, last_audio=ttft * 3, audio_seconds=1.0) for i in range(4)]
    records.append(RequestRecord(index=4, error="HTTP 500: boom"))
    return build_result({"target": "t", "rate": rate, "modalities": ("text", "audio")}, records, 2.0, None)


def text_of(renderable: object) -> str:
    console = Console(width=140, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_table_shows_counts_throughput_latencies_and_errors() -> None:
    text = text_of(render(result(0.1, None)))
    assert "4 / 1" in text and "2.00 s" in text
    assert "requests/s" in text and "2.00" in text  # 4 completed in 2 s
    assert "100.0" in text  # ttft 0.1 s shown in ms
    assert "0.300" in text  # RTF 0.3 s of generation per 1 s of audio
    assert "HTTP 500: boom" in text


def test_compare_shows_the_changes_and_differing_settings() -> None:
    text = text_of(compare(result(0.2, None), result(0.1, 5.0)))
    row = next(line for line in text.splitlines() if "time to first text p50" in line)
    assert "200.0" in row and "100.0" in row and "-100.0" in row and "-50.0%" in row
    assert "the runs differ in rate" in text


def test_json_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result(0.1, None)))
    assert load_result(path)["summary"]["completed"] == 4
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not a readable bench result"):
        load_result(tmp_path / "bad.json")


def test_429s_are_counted_apart_from_failures_and_goodput_is_completed_per_second() -> None:
    records = [RequestRecord(index=i, ok=True, e2e=0.1) for i in range(3)]
    records += [RequestRecord(index=3 + i, error="HTTP 429: busy", overloaded=True) for i in range(5)]
    records.append(RequestRecord(index=8, error="HTTP 500: boom"))
    summary = build_result({"target": "t"}, records, 1.5, None)["summary"]
    assert (summary["sent"], summary["completed"], summary["failed"], summary["overloaded"]) == (9, 3, 1, 5)
    assert summary["goodput"] == pytest.approx(2.0)
    text = text_of(render(build_result({"target": "t"}, records, 1.5, None)))
    assert "refused (429, overloaded)" in text and "goodput" in text


def test_a_request_that_asked_for_audio_and_completed_with_none_is_counted_and_named() -> None:
    """Qwen3-Omni's talker can pick its end code first: the request completes, its client gets
    no audio (while the trace marks code2wav's empty answer as first audio). The bench says so."""
    spoke = [RequestRecord(index=i, ok=True, request_id=f"r{i}", ttfa=0.1, last_audio=0.2, audio_seconds=0.5,
                           audio_chunks=[(0.1, 0.5)], e2e=0.3) for i in range(3)]
    silent = RequestRecord(index=3, ok=True, request_id="chatcmpl-silent", ttft=0.05, e2e=0.1)
    failed = RequestRecord(index=4, error="HTTP 500: boom")
    done = build_result({"target": "t", "modalities": ["text", "audio"]}, [*spoke, silent, failed], 1.0, None)
    assert done["summary"]["completed"] == 4 and done["latency"]["ttfa"]["count"] == 3
    assert done["summary"]["completed_without_audio"] == 1
    assert done["summary"]["without_audio"] == ["chatcmpl-silent"]
    text = text_of(render(done))
    assert "completed without audio" in text and "chatcmpl-silent" in text
    text_only = build_result({"target": "t", "modalities": ["text"]}, [silent], 1.0, None)
    assert text_only["summary"]["completed_without_audio"] == 0  # it asked for none
    assert "completed without audio" not in text_of(render(text_only))
