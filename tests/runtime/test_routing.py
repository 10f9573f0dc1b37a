"""Fan-in, dynamic routing and its contract, failures of one request."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import omnictl
from tests.support import topo
from tests.support.loop import LoopThread, launch

E = "omnictl.models.examples"


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """router --route_fn--> {left, right} --> join (fan-in) --> out; plus a side branch
    that fails on a magic word. Two processes so both inproc and shm edges are used."""
    stages = [
        {"name": "router", "factory": f"{E}.fail_on", "factory_args": {"word": "explode"},
         "route_fn": f"{E}.route_by_kind", "next": ["left", "right"], "process": "front"},
        {"name": "left", "factory": f"{E}.append", "factory_args": {"tag": "left"}, "next": ["join"], "process": "front"},
        {"name": "right", "factory": f"{E}.append", "factory_args": {"tag": "right"}, "next": ["join"], "process": "back"},
        {"name": "join", "factory": f"{E}.identity", "wait_for": ["left", "right"], "merge_fn": f"{E}.merge_dicts",
         "next": ["out"], "process": "back"},
        {"name": "out", "factory": f"{E}.identity", "terminal": True, "modality": "trail", "process": "back"},
    ]
    path = topo.write(tmp_path_factory.mktemp("routing") / "routing.yaml", stages)
    pipeline = launch(loop, path, profile=False, launcher="threads")  # kills nothing: replicas as threads
    yield pipeline
    loop.run(pipeline.close())


def result(loop: LoopThread, pipe: Any, data: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        return await (await pipe.submit(data)).result()

    return loop.run(go())


def test_fan_in_waits_for_both_branches(loop: LoopThread, pipe: Any) -> None:
    out = result(loop, pipe, {"text": "both ways", "route": ["left", "right"]})["out"]
    assert out["left"]["text"] == out["right"]["text"] == "both ways"
    assert out["sources"] == ["left", "right"]
    assert out["left"]["trail"] == ["left"] and out["right"]["trail"] == ["right"]


@pytest.mark.parametrize("branch", ["left", "right"])
def test_fan_in_expects_only_the_branch_the_route_fn_chose(loop: LoopThread, pipe: Any, branch: str) -> None:
    out = result(loop, pipe, {"text": "one way", "route": branch})["out"]
    assert out["sources"] == [branch]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, r"route_fn of stage 'router' returned None"),
        ([], r"route_fn of stage 'router' returned \[\]"),
        ("nowhere", r"\['nowhere'\] not declared in its `next`"),
    ],
)
def test_route_fn_contract_violation_fails_only_that_request(
    loop: LoopThread, pipe: Any, value: Any, message: str
) -> None:
    with pytest.raises(omnictl.RequestFailed, match=message) as failure:
        result(loop, pipe, {"text": "x", "route": value})
    assert failure.value.stage == "router"
    # the stage keeps serving others
    assert result(loop, pipe, {"text": "still here", "route": "left"})["out"]["left"]["text"] == "still here"


def test_function_that_raises_fails_its_request_naming_stage_and_message(loop: LoopThread, pipe: Any) -> None:
    with pytest.raises(omnictl.RequestFailed, match=r"stage 'router' failed: ValueError: refusing input containing 'explode'"):
        result(loop, pipe, {"text": "please explode", "route": "left"})
    assert result(loop, pipe, {"text": "fine", "route": "right"})["out"]["right"]["text"] == "fine"


def test_stats_show_no_state_after_mixed_outcomes(loop: LoopThread, pipe: Any) -> None:
    stats = loop.run(pipe.stats())
    assert set(stats) == {"router", "left", "right", "join", "out"}
    for stage, entry in stats.items():
        assert entry["status"] == "up"
        held = {k: v for k, v in entry.items() if k not in ("status", "process")}
        assert not any(held.values()), (stage, held)
