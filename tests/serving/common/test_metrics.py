"""``/metrics``' process and profile families in the test process: a process (each replica on
its own) up or down, an elastic process's standby replicas left out, the autoscaler's replica
counts and decisions, replays and resumed streams, and the profiler's per-stage and per-edge
latency quantiles with their counts. Rendered by prometheus_client from the real collectors,
read as a scraper reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from omnictl.profiling.stats import EdgeStats, HeaderStats, ProfileSnapshot, StageStats
from omnictl.serving.app import create_app
from omnictl.serving.state import ServingState
from omnictl.topology.validation import load
from tests.serving.scripted import ScriptedPipeline
from tests.support.topo import write

KEY = "sk-test"


def samples(state: ServingState, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each sample of ``family`` (and its _total / _count series): labels, sorted, to value."""
    text = generate_latest(state.metrics.registry).decode()
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for metric in text_string_to_metric_families(text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            found[(("__name__", sample.name), *sorted(sample.labels.items()))] = sample.value
    return found


def replicated(tmp_path: Path) -> Any:
    return load(
        write(
            tmp_path / "replicated.yaml",
            [
                {"name": "front", "factory": "tests.support.stages.preprocessing", "next": ["speak"]},
                {
                    "name": "speak",
                    "factory": "tests.support.stages.preprocessing",
                    "process": "tts",
                    "terminal": True,
                    "modality": "audio",
                },
            ],
            processes={"tts": {"replicas": {"min": 1, "max": 3}}},
        )
    )


def test_without_a_pipeline_the_process_families_are_absent() -> None:
    state = ServingState(model_name="m", api_key=KEY)
    assert samples(state, "omnictl_process_up") == {}
    assert samples(state, "omnictl_stage_latency_seconds") == {}


def test_each_running_replica_is_up_or_down_and_a_standby_one_has_no_series(tmp_path: Path) -> None:
    pipeline = ScriptedPipeline(topology=replicated(tmp_path))
    pipeline.health_status = ("degraded", {"tts#1": "exited"})
    pipeline.standby = {"tts#2": None}
    pipeline.replayed, pipeline.resumed = 4, 1
    pipeline.scaling = lambda: {"tts": {"replicas": 2, "scaled_up": 3, "scaled_down": 1}}  # type: ignore[method-assign]
    state = ServingState(model_name="m", pipeline=pipeline, api_key=KEY)
    state.metrics.processes.pipeline = pipeline
    up = samples(state, "omnictl_process_up")
    assert up == {
        (("__name__", "omnictl_process_up"), ("group", "front"), ("process", "front")): 1.0,
        (("__name__", "omnictl_process_up"), ("group", "tts"), ("process", "tts#0")): 1.0,
        (("__name__", "omnictl_process_up"), ("group", "tts"), ("process", "tts#1")): 0.0,
    }
    assert samples(state, "omnictl_replicas") == {(("__name__", "omnictl_replicas"), ("group", "tts")): 2.0}
    assert samples(state, "omnictl_scaling_decisions") == {
        (("__name__", "omnictl_scaling_decisions_total"), ("direction", "up"), ("group", "tts")): 3.0,
        (("__name__", "omnictl_scaling_decisions_total"), ("direction", "down"), ("group", "tts")): 1.0,
    }
    assert samples(state, "omnictl_requests_replayed") == {(("__name__", "omnictl_requests_replayed_total"),): 4.0}
    assert samples(state, "omnictl_requests_resumed") == {(("__name__", "omnictl_requests_resumed_total"),): 1.0}


def _snapshot() -> ProfileSnapshot:
    header = HeaderStats(
        uptime_s=10,
        in_flight=0,
        completed=3,
        failed=0,
        aborted=0,
        requests_per_s=0.3,
        ttft_p50_s=None,
        ttft_p99_s=None,
        ttfa_p50_s=None,
        ttfa_p99_s=None,
        dropped_events=0,
    )
    stages = {
        "front": StageStats("front", "front", 0, 3, 0.3, 0.01, 0.02, 0.2, None, n=3),
        "speak": StageStats("speak", "tts", 1, 2, 0.2, None, 0.5, 0.8, None, n=2),  # p50 not known
    }
    edges = {("front", "speak", "data"): EdgeStats("front", "speak", "data", "shm", 5, 0.001, 0.004, 1.5)}
    return ProfileSnapshot(taken_ns=0, window_s=30.0, header=header, stages=stages, edges=edges)


def test_the_profiler_s_latencies_are_summaries_with_their_counts_and_window() -> None:
    state = ServingState(model_name="m", api_key=KEY)
    state.metrics.profile.snapshot = _snapshot
    stage = samples(state, "omnictl_stage_latency_seconds")
    name = "omnictl_stage_latency_seconds"
    assert stage == {
        (("__name__", name), ("quantile", "0.5"), ("stage", "front")): 0.01,
        (("__name__", name), ("quantile", "0.99"), ("stage", "front")): 0.02,
        (("__name__", f"{name}_count"), ("stage", "front")): 3.0,
        (("__name__", name), ("quantile", "0.99"), ("stage", "speak")): 0.5,
        (("__name__", f"{name}_count"), ("stage", "speak")): 2.0,
    }
    edge = samples(state, "omnictl_edge_latency_seconds")
    name = "omnictl_edge_latency_seconds"
    labels = (("dst", "speak"), ("kind", "data"))
    assert edge == {
        (("__name__", name), *labels, ("quantile", "0.5"), ("src", "front")): 0.001,
        (("__name__", name), *labels, ("quantile", "0.99"), ("src", "front")): 0.004,
        (("__name__", f"{name}_count"), *labels, ("src", "front")): 5.0,
    }
    text = generate_latest(state.metrics.registry).decode()
    assert "# HELP omnictl_stage_latency_seconds Time at a stage, first input to done (profiler window 30s)" in text
    assert "# HELP omnictl_edge_latency_seconds Hop latency, sent to received, per edge (profiler window 30s)" in text
    assert "# TYPE omnictl_stage_latency_seconds summary" in text


def test_profiling_off_shows_no_latency_family() -> None:
    state = ServingState(model_name="m", api_key=KEY)
    state.metrics.profile.snapshot = lambda: None
    assert samples(state, "omnictl_stage_latency_seconds") == {}
    assert samples(state, "omnictl_edge_latency_seconds") == {}


def test_the_route_serves_the_same_families(tmp_path: Path) -> None:
    pipeline = ScriptedPipeline(topology=replicated(tmp_path))
    state = ServingState(model_name="m", pipeline=pipeline, api_key=KEY)
    state.metrics.processes.pipeline = pipeline
    state.metrics.profile.snapshot = _snapshot
    client = TestClient(create_app(state), base_url="http://localhost")
    text = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'omnictl_process_up{group="tts",process="tts#0"} 1.0' in text
    assert 'omnictl_stage_latency_seconds_count{stage="front"} 3.0' in text
