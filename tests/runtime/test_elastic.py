"""Elastic replicas (`replicas: {min, max}`) over real stage processes: a sustained queue
starts a standby replica; a calm process drains one, whose request in flight completes
before it stops; a burst queued on one replica is shared with the replica it starts."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from omnictl.serving.common.metrics import ProcessMetrics

from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

E = "omnictl.models.examples"
R = "tests.support.replica_stages"


def elastic(tmp_path: Path) -> Path:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["work"], "process": "front"},
        {"name": "work", "factory": f"{R}.pid_after_asked", "factory_args": {"seconds": 0.1}, "terminal": True},
    ]
    knobs = {"work": {"replicas": {"min": 1, "max": 2, "queue": 2, "window": 0.3, "idle": 1.0}}}
    return topo.write(tmp_path / "elastic.yaml", stages, processes=knobs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_queue_adds_a_replica_and_a_calm_process_drains_one_without_losing_its_request(
    loop: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnictl.coordinator.coordinator")
    pipe = launch(loop, elastic(tmp_path), profile=False)
    try:
        assert pipe.standby == {"work#1"} and "work#1" not in pipe.process_ids()
        assert pipe.scaling() == {"work": {"replicas": 1, "scaled_up": 0, "scaled_down": 0}}
        first = pipe.process_ids()["work#0"]

        async def client(start: int) -> list[dict[str, Any]]:
            # closed loop: a request is pinned at submit, so the added replica takes new ones
            return [(await (await pipe.submit({"i": i})).result())["work"] for i in range(start, start + 8)]

        async def flood() -> list[dict[str, Any]]:
            # 6 clients, 48 requests of 0.1 s: about 5 s for one replica
            return [o for batch in await asyncio.gather(*(client(8 * c) for c in range(6))) for o in batch]

        outputs = loop.run(flood(), timeout=60)
        assert sorted(o["i"] for o in outputs) == list(range(48))
        second = pipe.process_ids()["work#1"]
        assert {o["work_pid"] for o in outputs} == {first, second}  # the added replica took a share
        assert pipe.scaling()["work"]["scaled_up"] == 1
        up = [r.getMessage() for r in caplog.records if "scaling process 'work' up" in r.getMessage()]
        assert len(up) == 1 and "requests in flight per replica" in up[0] and "(above 2 for 0.3s)" in up[0]

        async def calm() -> list[dict[str, Any]]:
            # one long request on each replica: 1 per replica, half the threshold, for the idle window
            requests = [await pipe.submit({"i": i, "seconds": 2.5}) for i in range(2)]
            return [(await r.result())["work"] for r in requests]

        long = loop.run(calm(), timeout=30)
        # work#1 was drained while its request ran: it completed there, then work#1 stopped
        assert sorted(o["work_pid"] for o in long) == sorted([first, second])
        assert until(lambda: pipe.standby == {"work#1"}, timeout=10)
        assert until(lambda: not _alive(second), timeout=10)
        assert pipe.scaling() == {"work": {"replicas": 1, "scaled_up": 1, "scaled_down": 1}}
        messages = [r.getMessage() for r in caplog.records]
        drained = next(i for i, line in enumerate(messages) if "scaling process 'work' down: 'work#1'" in line)
        stopped = next(i for i, line in enumerate(messages) if "replica 'work#1' drained and stopped" in line)
        assert drained < stopped
        assert pipe.health() == ("ok", {})
        metrics = _scrape(pipe)
        assert 'omnictl_scaling_decisions_total{direction="up",group="work"} 1.0' in metrics
        assert 'omnictl_scaling_decisions_total{direction="down",group="work"} 1.0' in metrics
        assert 'omnictl_replicas{group="work"} 1.0' in metrics
        assert 'process="work#0"' in metrics and 'process="work#1"' not in metrics  # standby: no series
        # scaled down to min, it still serves; and scales up again from a clean standby
        assert loop.run(asyncio.wait_for(_one(pipe), 10))["work_pid"] == first
        assert loop.run(pipe.held())["coordinator"]["requests"] == 0
    finally:
        loop.run(pipe.close())


def test_a_burst_queued_on_one_replica_moves_in_part_to_the_replica_it_starts_and_each_request_runs_once(
    loop: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnictl.coordinator.coordinator")
    runs = tmp_path / "runs.log"
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["work"], "process": "front"},
        {"name": "work", "factory": f"{R}.pid_after_logged", "factory_args": {"seconds": 0.15, "log": str(runs)},
         "terminal": True},
    ]
    # a short window, and an idle one longer than the test: nothing is drained meanwhile
    knobs = {"work": {"replicas": {"min": 1, "max": 2, "queue": 2, "window": 0.05, "idle": 60}}}
    pipe = launch(loop, topo.write(tmp_path / "burst.yaml", stages, processes=knobs), profile=False)
    try:
        first = pipe.process_ids()["work#0"]

        async def burst() -> list[dict[str, Any]]:
            # all 16 pinned to work#0 at submit (the one running): 2.4 s of work for it alone
            requests = [await pipe.submit({"i": i}) for i in range(16)]
            return [(await r.result())["work"] for r in requests]

        outputs = loop.run(burst(), timeout=60)
        assert [o["i"] for o in outputs] == list(range(16))  # every request, its own result
        second = pipe.process_ids()["work#1"]
        where = {o["i"]: o["work_pid"] for o in outputs}
        taken = sorted(i for i, pid in where.items() if pid == second)
        # the new replica took the newest of the backlog (the oldest had started on work#0)
        assert taken and taken == list(range(16 - len(taken), 16)), where
        assert set(where.values()) == {first, second}
        moved = [r.getMessage() for r in caplog.records if "queued request(s) moved to it" in r.getMessage()]
        assert len(moved) == 1 and moved[0].startswith(f"replica 'work#1' is up; {len(taken)} queued"), moved
        # each ran exactly once, where its result came from: a moved request never ran on work#0
        ran = [tuple(map(int, line.split())) for line in runs.read_text().splitlines()]
        assert sorted(ran) == sorted(where.items())
        assert pipe.replayed == 0 and loop.run(pipe.held())["coordinator"]["requests"] == 0
    finally:
        loop.run(pipe.close())


async def _one(pipe: Any) -> dict[str, Any]:
    return (await (await pipe.submit({"i": "after"})).result())["work"]


def _scrape(pipe: Any) -> str:
    collector = ProcessMetrics()
    collector.pipeline = pipe
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()
