"""Per-stage and per-edge figures from the trace store and from a /metrics scrape."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from omnictl.bench.breakdown import from_metrics, from_trace_store
from omnictl.profiling.aggregate import Aggregator
from tests.support.synthetic import qwen_omni_topology, synthetic_request
from omnictl.profiling.store import TraceStore
from omnictl.serving.common.metrics import ServerMetrics

STAGES = set(qwen_omni_topology().stages)


def test_trace_store_breakdown_covers_only_the_measured_requests(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    t0 = time.time_ns()
    for i in range(3):
        store.append(synthetic_request(f"r{i}", start_ns=t0 + i * 10**8, work_ms=2.0))
    store.append(synthetic_request("other", start_ns=t0, work_ms=500.0))  # someone else's slow request
    store.close()
    found = from_trace_store(tmp_path, ["r0", "r1", "r2"], wait_s=0)
    assert found["source"] == "trace_store" and found["requests"] == 3
    assert set(found["stages"]) == STAGES
    for name, stage in found["stages"].items():
        assert stage["count"] == 3, name
        assert stage["p50"] <= stage["p90"] <= stage["p99"] < 0.4, name  # the 500 ms request is not in here
    assert {"prefill", "decode"} <= set(found["stages"]["thinker"]["parts"])
    assert "thinker->talker (stream)" in found["edges"] and "thinker->decode" in found["edges"]
    assert all(edge["count"] >= 3 for edge in found["edges"].values())


def test_metrics_summaries_round_trip_through_the_exposition() -> None:
    aggregator = Aggregator(window_s=60)
    t0 = time.time_ns() - 10**9
    for i in range(5):
        aggregator.add(synthetic_request(f"r{i}", start_ns=t0 + i * 10**7))
    metrics = ServerMetrics()
    metrics.profile.snapshot = aggregator.snapshot
    found = from_metrics(metrics.exposition().decode())
    snapshot = aggregator.snapshot()
    assert found["source"] == "metrics"
    assert set(found["stages"]) == set(snapshot.stages)
    for name, stats in snapshot.stages.items():
        assert found["stages"][name]["p50"] == pytest.approx(stats.p50_s)
        assert found["stages"][name]["count"] == stats.done
    data_edges = {f"{src}->{dst}" for (src, dst, kind) in snapshot.edges if kind == "data"}
    assert data_edges <= set(found["edges"])


def test_no_profiler_means_no_stage_series() -> None:
    text = ServerMetrics().exposition().decode()
    assert "omnictl_stage_latency_seconds" not in text
    assert from_metrics(text) == {"source": "metrics", "stages": {}, "edges": {}}


def test_a_named_phase_is_a_part_and_the_parts_cover_the_stage(tmp_path: Path) -> None:
    from omnictl.profiling.events import Event, EventKind
    from omnictl.schedulers.simple import SimpleScheduler

    recorded: list[Event] = []

    class Recorder:
        def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: object) -> None:
            recorded.append(Event(kind, request_id, stage, "p", time.time_ns(), meta))  # type: ignore[arg-type]

    scheduler = SimpleScheduler(lambda data: data)
    scheduler.profiler, scheduler.stage_name = Recorder(), "tts"
    ms = 1_000_000
    recorded.append(Event(EventKind.ADMITTED, "r", None, "coordinator", time.time_ns()))
    recorded.append(Event(EventKind.QUEUE_ENTER, "r", "tts", "p", time.time_ns()))
    with scheduler.computing("r", "synthesis"):
        time.sleep(0.03)
    time.sleep(0.01)
    recorded.append(Event(EventKind.STAGE_DONE, "r", "tts", "p", time.time_ns()))
    recorded.append(Event(EventKind.COMPLETED, "r", None, "coordinator", time.time_ns() + ms))
    store = TraceStore(tmp_path)
    store.append(recorded)
    store.close()
    stage = from_trace_store(tmp_path, ["r"], wait_s=0)["stages"]["tts"]
    assert stage["parts"]["synthesis"] >= 0.03
    assert stage["parts"]["other"] >= 0.009
    assert sum(stage["parts"].values()) == pytest.approx(stage["mean"])


def test_overlapping_parts_are_counted_once(tmp_path: Path) -> None:
    # A TTS stage synthesises the first sentence while its fan-in still waits for the rest:
    # 40 ms of fan-in wait, 30 ms of synthesis inside it, 10 ms of queue overlapping both.
    from omnictl.profiling.events import Event, EventKind

    t0, ms = time.time_ns(), 1_000_000

    def event(kind: EventKind, at_ms: float, **meta: object) -> Event:
        return Event(kind, "r", None if kind in (EventKind.ADMITTED, EventKind.COMPLETED) else "tts", "p",
                     t0 + int(at_ms * ms), meta)  # type: ignore[arg-type]

    events = [
        event(EventKind.ADMITTED, 0),
        event(EventKind.INPUT_RECEIVED, 0, upstream="thinker"),
        event(EventKind.FANIN_WAIT_START, 0),
        event(EventKind.QUEUE_ENTER, 5),
        event(EventKind.COMPUTE_START, 10, phase="synthesis"),
        event(EventKind.COMPUTE_END, 40, phase="synthesis"),
        event(EventKind.FANIN_WAIT_END, 40),
        event(EventKind.STAGE_DONE, 50),
        event(EventKind.COMPLETED, 51),
    ]
    store = TraceStore(tmp_path)
    store.append(events)
    store.close()
    stage = from_trace_store(tmp_path, ["r"], wait_s=0)["stages"]["tts"]
    parts = stage["parts"]
    assert parts["synthesis"] == pytest.approx(0.030, abs=1e-6)
    assert sum(parts.values()) == pytest.approx(stage["mean"])  # never more: 100%, not 118-135%
    assert sum(v for k, v in parts.items() if k != "other") <= stage["mean"] + 1e-9
    assert parts.get("fanin_wait", 0) + parts.get("queue", 0) == pytest.approx(0.010, abs=1e-6)
