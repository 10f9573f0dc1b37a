"""Faults: a factory that raises, a stage process that dies, a request that would hang."""

from __future__ import annotations

import time

from pathlib import Path
from typing import Any

import pytest

import omnictl
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Longer than the suite's default deadline: stage processes killed and restarted, up to ~16 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

E = "omnictl.models.examples"
S = "tests.support.stages"


def crashy(tmp_path: Path) -> Path:
    return topo.write(
        tmp_path / "crashy.yaml",
        [
            {"name": "front", "factory": f"{E}.identity", "next": ["crasher"], "process": "one"},
            {"name": "crasher", "factory": f"{S}.crash_on", "factory_args": {"word": "die"}, "next": ["out"], "process": "two"},
            {"name": "out", "factory": f"{E}.identity", "terminal": True, "process": "two"},
        ],
    )


async def _result(pipe: Any, data: dict[str, Any]) -> dict[str, Any]:
    return await (await pipe.submit(data)).result()


def test_factory_that_raises_fails_launch_naming_the_stage_with_traceback(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "broken.yaml",
        [
            {"name": "fine", "factory": f"{E}.identity", "next": ["loader"]},
            {"name": "loader", "factory": f"{S}.broken_factory", "terminal": True},
        ],
    )
    with pytest.raises(omnictl.LaunchError) as failure:
        launch(loop, path, profile=False)
    assert failure.value.stage == "loader"
    assert "Traceback" in str(failure.value) and "weights not found at /nowhere" in str(failure.value)


def test_dead_stage_process_fails_its_requests_and_the_pipeline_refuses_work(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, crashy(tmp_path), profile=False)
    try:
        assert loop.run(_result(pipe, {"text": "hello"}))["out"]["text"] == "hello"
        started = time.monotonic()
        with pytest.raises(omnictl.RequestFailed, match=r"stage 'crasher' failed: .*process 'two'.*exit code 3"):
            loop.run(_result(pipe, {"text": "please die"}))
        # failed when the process died, not when the request's deadline (300 s) ran out
        assert time.monotonic() - started < 10
        assert not pipe.healthy
        stats = loop.run(pipe.stats())
        assert stats["crasher"]["status"] == "down" and stats["out"]["status"] == "down"
        assert stats["front"]["status"] == "up"
        with pytest.raises(omnictl.PipelineDead, match="crasher"):
            loop.run(_result(pipe, {"text": "anyone there"}))
    finally:
        loop.run(pipe.close())


def test_restart_policy_brings_a_dead_stage_back(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, crashy(tmp_path), profile=False, max_restarts=1, replay_limit=0)  # a replay would die too
    try:
        with pytest.raises(omnictl.RequestFailed, match="exit code 3"):
            loop.run(_result(pipe, {"text": "die now"}))
        assert until(lambda: pipe.healthy, timeout=60)
        assert loop.run(_result(pipe, {"text": "back again"}))["out"]["text"] == "back again"
    finally:
        loop.run(pipe.close())


def test_deadline_fails_a_request_that_would_otherwise_wait_forever(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "slow.yaml",
        [
            {"name": "slow", "factory": f"{E}.sleep", "factory_args": {"seconds": 30}, "next": ["out"]},
            {"name": "out", "factory": f"{E}.identity", "terminal": True},
        ],
    )
    pipe = launch(loop, path, profile=False, request_timeout=0.5)
    try:
        with pytest.raises(omnictl.RequestFailed, match=r"missed its deadline of 0.5s; terminals still expected: \['out'\]"):
            loop.run(_result(pipe, {"text": "x"}))
    finally:
        loop.run(pipe.close())
