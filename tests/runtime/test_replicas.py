"""Replicas: each request stays on one replica; a replica's death fails only its requests;
aborts reach every replica."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import numpy as np

import omnictl
from tests.support.held import held_by
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

E = "omnictl.models.examples"
R = "tests.support.replica_stages"


def sticky_topology(tmp_path: Path) -> Path:
    """A replicated process holding a streaming stage (``collect``) and a fan-in stage
    (``join``), fed from an unreplicated one."""
    stages = [
        {"name": "gen", "factory": f"{R}.tokens", "factory_args": {"count": 4}, "next": ["collect", "side"],
         "stream_to": ["collect"], "process": "front"},
        {"name": "side", "factory": f"{R}.side", "next": ["join"], "process": "front"},
        {"name": "collect", "factory": f"{R}.pid_collector", "next": ["join"], "process": "rep"},
        {"name": "join", "factory": f"{E}.identity", "wait_for": ["collect", "side"],
         "merge_fn": f"{R}.merge_with_pid", "terminal": True, "process": "rep"},
    ]
    return topo.write(tmp_path / "sticky.yaml", stages, processes={"rep": {"replicas": 3}})


def test_every_part_and_chunk_of_a_request_lands_in_one_replica(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, sticky_topology(tmp_path), profile=False)
    try:
        pids = pipe.process_ids()
        assert sorted(pids) == ["front", "rep#0", "rep#1", "rep#2"]
        replicas = {pids[f"rep#{i}"] for i in range(3)}

        async def flood() -> list[dict[str, Any]]:
            requests = [await pipe.submit({"tag": f"r{i}"}) for i in range(200)]
            return [(await r.result())["join"] for r in requests]

        outputs = loop.run(flood())
        used: set[int] = set()
        for i, out in enumerate(outputs):
            assert out["tag"] == f"r{i}" and out["streamed"] == [0, 1, 2, 3]
            here = {out["collect_pid"], out["join_pid"], *out["chunk_pids"]}
            assert len(here) == 1, (out["tag"], here)  # one replica for every chunk and part
            assert here <= replicas
            assert out["side_pid"] == pids["front"]
            used |= here
        assert used == replicas  # the load spread over all three
        stats = loop.run(pipe.stats())
        assert stats["join"]["process"] == "rep" and set(stats["join"]["replicas"]) == {"rep#0", "rep#1", "rep#2"}
    finally:
        loop.run(pipe.close())


def work_topology(tmp_path: Path, seconds: float) -> Path:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["work"], "process": "front"},
        {"name": "work", "factory": f"{R}.pid_after", "factory_args": {"seconds": seconds}, "next": ["out"]},
        {"name": "out", "factory": f"{E}.identity", "terminal": True, "process": "front"},
    ]
    return topo.write(tmp_path / "work.yaml", stages, processes={"work": {"replicas": 2}})


async def _outcome(request: Any) -> Any:
    try:
        return (await request.result())["out"]
    except omnictl.RequestFailed as failed:
        return failed


def test_a_killed_replica_fails_only_its_requests_and_comes_back(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, work_topology(tmp_path, 0.1), profile=False, max_restarts=1, replay_limit=0)
    try:
        pids = pipe.process_ids()
        victim, survivor = pids["work#1"], pids["work#0"]

        async def under_load() -> tuple[list[Any], str, dict[str, Any]]:
            requests = [await pipe.submit({"i": i}) for i in range(30)]
            await asyncio.sleep(0.35)  # both replicas are busy with their share
            os.kill(victim, signal.SIGKILL)
            while pipe.health()[0] == "ok":
                await asyncio.sleep(0.01)
            status = pipe.health()[0]
            # submitted while degraded: goes to the surviving replica at once
            during = await (await pipe.submit({"i": "during"})).result()
            return [await _outcome(r) for r in requests], status, during["out"]

        outcomes, status, during = loop.run(under_load())
        assert status == "degraded"
        assert during["work_pid"] == survivor
        failed = [o for o in outcomes if isinstance(o, omnictl.RequestFailed)]
        done = [o for o in outcomes if not isinstance(o, omnictl.RequestFailed)]
        assert failed and done
        for failure in failed:
            assert failure.stage == "work"
            assert re.search(r"stage 'work' failed: replica 'work#1' \(stages work\) died: killed by SIGKILL",
                             str(failure)), str(failure)
        # Everything the survivor held completed; the victim finished some before it died.
        assert {o["work_pid"] for o in done} <= {victim, survivor}
        assert sum(1 for o in done if o["work_pid"] == survivor) >= 14
        assert until(lambda: pipe.health()[0] == "ok", timeout=60)
        assert pipe.process_ids()["work#1"] != victim
        async def several() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*[_one(pipe, {"i": i}) for i in range(6)]))

        after = loop.run(several())
        assert {o["out"]["work_pid"] for o in after} == {survivor, pipe.process_ids()["work#1"]}
    finally:
        loop.run(pipe.close())


def test_health_is_down_once_a_process_has_no_replica_left(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, work_topology(tmp_path, 0.0), profile=False)
    try:
        pids = pipe.process_ids()
        os.kill(pids["work#0"], signal.SIGKILL)
        assert until(lambda: pipe.health()[0] == "degraded", timeout=15)
        assert list(pipe.health()[1]) == ["work#0"]
        assert loop.run(_one(pipe, {"i": 1}))["out"]["work_pid"] == pids["work#1"]
        stats = loop.run(pipe.stats())
        assert stats["work"]["status"] == "degraded"
        assert stats["work"]["replicas"]["work#0"]["status"] == "down"
        os.kill(pids["work#1"], signal.SIGKILL)
        assert until(lambda: pipe.health()[0] == "down", timeout=15)
        try:
            loop.run(_one(pipe, {"i": 2}))
        except omnictl.PipelineDead as dead:
            assert "work#1" in str(dead)
        else:
            raise AssertionError("a pipeline whose process lost every replica took work")
    finally:
        loop.run(pipe.close())


async def _one(pipe: Any, data: dict[str, Any]) -> dict[str, Any]:
    return await (await pipe.submit(data)).result()


def test_aborting_a_hundred_requests_spread_over_replicas_leaves_no_state(loop: LoopThread, tmp_path: Path) -> None:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["b", "c"], "process": "one"},
        # 0.2 s a request: 100 requests hold 3 replicas for ~7 s, so however slowly a loaded
        # machine submits them, most are still in flight when the aborts go out
        {"name": "b", "factory": f"{E}.sleep", "factory_args": {"seconds": 0.2}, "next": ["d"], "process": "two"},
        {"name": "c", "factory": f"{E}.identity", "next": ["d"], "process": "one"},
        {"name": "d", "factory": f"{E}.identity", "wait_for": ["b", "c"], "merge_fn": f"{E}.merge_dicts",
         "terminal": True, "modality": "merged", "process": "two"},
    ]
    path = topo.write(tmp_path / "abort.yaml", stages, processes={"two": {"replicas": 3}})
    pipe = launch(loop, path, profile=False)
    try:
        async def flood() -> list[Any]:
            blob = np.ones(64 * 1024, dtype=np.float32)  # over the inline threshold: shm slots
            requests = [await pipe.submit({"text": f"r{i}", "blob": blob}) for i in range(100)]
            # let them get into the replicas: a burst of 100 arrives at once, and each payload
            # past the sender's 8 slots (held, as views, by the replicas still sleeping on them)
            # takes a fresh segment of its own, which a loaded machine creates slowly
            deadline = asyncio.get_running_loop().time() + 5
            busy = await pipe.stats()
            while not all(_held(busy).values()) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                busy = await pipe.stats()
            for request in requests:
                await pipe.abort(request.id)
            return [busy] + [await _aborted_or_result(r) for r in requests]

        busy, *outcomes = loop.run(flood())
        # work was in every replica when the aborts went out
        held = _held(busy)
        assert all(held.values()), held
        assert sum(isinstance(o, omnictl.RequestAborted) for o in outcomes) > 50
        assert pipe.in_flight() == 0
        assert loop.run(held_by(pipe, timeout=15), timeout=60) == []
        assert loop.run(_one(pipe, {"text": "after"}))["d"]["sources"] == ["b", "c"]
    finally:
        loop.run(pipe.close())


def _held(stats: dict[str, Any]) -> dict[str, int]:
    """Requests each replica of process ``two`` holds state for."""
    return {name: stats["b"]["replicas"][name]["requests"] + stats["d"]["replicas"][name]["requests"]
            for name in ("two#0", "two#1", "two#2")}


async def _aborted_or_result(request: Any) -> Any:
    try:
        return await request.result()
    except omnictl.RequestAborted as aborted:
        return aborted


def test_the_trace_names_the_replica_that_served_the_request(tmp_path: Path) -> None:
    from omnictl.pipeline import Pipeline
    from omnictl.profiling.spans import build_trace
    from omnictl.profiling.store import TraceStore

    run_dir = tmp_path / "run"

    async def main() -> tuple[list[tuple[str, int]], dict[str, int]]:
        async with Pipeline.launch(work_topology(tmp_path, 0.0), run_dir=run_dir, profile=True) as pipe:
            served = []
            for i in range(4):
                request = await pipe.submit({"i": i})
                served.append((request.id, (await request.result())["out"]["work_pid"]))
            return served, pipe.process_ids()

    served, pids = asyncio.run(main())
    by_pid = {pid: name for name, pid in pids.items()}
    replicas = set()
    for request_id, pid in served:
        trace = build_trace(request_id, TraceStore(run_dir).events(request_id))
        assert trace.stage_process["work"] == by_pid[pid]  # work#0 or work#1, the one that ran it
        assert trace.stage_process["a"] == "front"
        replicas.add(trace.stage_process["work"])
    assert replicas == {"work#0", "work#1"}  # idle replicas take turns
