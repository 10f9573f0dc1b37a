"""Faults found in review: none of them may hang a request or leak state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import omnictl
from tests.support.held import held_by
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Longer than the suite's default deadline: stage processes killed, restarted, relaunched, up to ~23 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

E = "omnictl.models.examples"
S = "tests.support.stages"


async def _result(pipe: Any, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return await (await pipe.submit(data, **kwargs)).result()


def test_a_user_object_in_an_output_fails_its_request_naming_stage_path_and_type(loop: LoopThread, tmp_path: Path) -> None:
    stages = [{"name": "a", "factory": f"{S}.returns_user_object", "next": ["b"], "process": "one"},
              {"name": "b", "factory": f"{E}.identity", "terminal": True, "process": "two"}]
    pipe = launch(loop, topo.write(tmp_path / "typed.yaml", stages), profile=False)
    try:
        with pytest.raises(omnictl.RequestFailed) as caught:
            loop.run(_result(pipe, {"value": 7}))
        message = str(caught.value)
        assert "stage 'a' could not send its output" in message
        assert "['out'][1]['thing']" in message and "tests.support.stages.UserThing" in message
        assert loop.run(pipe.stats())["a"]["requests"] == 0
    finally:
        loop.run(pipe.close())
    pipe = launch(loop, topo.write(tmp_path / "trusted.yaml", stages, allow_pickle=True), profile=False)
    try:
        from tests.support.stages import UserThing

        assert loop.run(_result(pipe, {"value": 7}))["b"] == {"out": [1, {"thing": UserThing(7)}]}
    finally:
        loop.run(pipe.close())


def test_outputs_that_cannot_cross_a_process_fail_their_request_only(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "bad-output.yaml",
        [
            {"name": "a", "factory": f"{S}.returns_unpicklable", "next": ["b"], "process": "one"},
            {"name": "b", "factory": f"{S}.returns_picky", "terminal": True, "process": "two"},
        ],
        allow_pickle=True,
    )
    pipe = launch(loop, path, profile=False)
    try:
        with pytest.raises(omnictl.RequestFailed, match=r"stage 'a' could not send its output: .*pickle"):
            loop.run(_result(pipe, {"lambda": True}))
        with pytest.raises(omnictl.RequestFailed, match=r"output of stage 'b' could not be decoded"):
            loop.run(_result(pipe, {"picky": True}))
        assert loop.run(_result(pipe, {"text": "fine"}))["b"]["text"] == "fine"
        stats = loop.run(pipe.stats())
        assert all(entry["requests"] == 0 for entry in stats.values())
    finally:
        loop.run(pipe.close())


def test_inputs_that_cannot_be_sent_leave_no_request_behind(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, topo.write(tmp_path / "one.yaml", [{"name": "a", "factory": f"{E}.identity", "terminal": True}]), profile=False)
    try:
        with pytest.raises(omnictl.UnsupportedPayload, match=r"\['fn'\]: a builtins.function"):
            loop.run(pipe.submit({"fn": lambda: None}, request_id="r1"))
        assert pipe.in_flight() == 0
        assert loop.run(held_by(pipe)) == []  # no admission slot, no placement, no record kept
        assert loop.run(_result(pipe, {"x": 1}, request_id="r1")) == {"a": {"x": 1}}
    finally:
        loop.run(pipe.close())


def test_stream_only_terminal_runs_and_route_skipped_stream_target_keeps_nothing(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "streams.yaml",
        [
            {"name": "src", "factory": f"{E}.words", "route_fn": f"{E}.route_by_kind", "next": ["collect", "plain"],
             "stream_to": ["collect", "count"], "process": "one"},
            {"name": "collect", "factory": f"{S}.chunk_collector", "terminal": True, "modality": "collected", "process": "two"},
            {"name": "plain", "factory": f"{E}.identity", "terminal": True, "modality": "json", "process": "two"},
            {"name": "count", "factory": f"{S}.stream_counter", "terminal": True, "modality": "counted", "process": "two"},
        ],
    )
    pipe = launch(loop, path, profile=False)
    try:
        # `count` is reached only through stream_to: it runs, also for a request that wants only its output
        assert loop.run(_result(pipe, {"text": "a b c", "route": "plain"}, modalities=["counted"])) == {"count": {"chunks": 3}}
        # `collect` gets the stream, then a skip from the route_fn: it must drop what it buffered
        for _ in range(3):
            out = loop.run(_result(pipe, {"text": "a b c", "route": "plain"}, modalities=["json", "collected"]))
            assert set(out) == {"plain"}
        assert until(lambda: all(e["stream_buffers"] == 0 and e["requests"] == 0 for e in loop.run(pipe.stats()).values()))
    finally:
        loop.run(pipe.close())


def test_a_failed_restart_is_retried_and_the_pipeline_recovers(loop: LoopThread, tmp_path: Path) -> None:
    marker = tmp_path / "fail-next-start"
    path = topo.write(
        tmp_path / "flaky.yaml",
        [{"name": "a", "factory": f"{S}.fails_once_after_marker", "factory_args": {"marker": str(marker)}, "terminal": True}],
    )
    pipe = launch(loop, path, profile=False, max_restarts=3)
    try:
        marker.write_text("x")
        with pytest.raises(omnictl.RequestFailed, match="exit code 3"):
            loop.run(_result(pipe, {"text": "die"}))
        assert until(lambda: pipe.healthy, timeout=60)
        assert not marker.exists()  # the first restart did fail
        assert loop.run(_result(pipe, {"text": "fine"}))["a"]["text"] == "fine"
    finally:
        loop.run(pipe.close())


def test_a_stage_that_cannot_take_its_input_counts_as_rejected_there(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "rejects.yaml",
        [
            {"name": "a", "factory": f"{S}.returns_picky", "next": ["b"], "process": "one"},
            {"name": "b", "factory": f"{E}.identity", "terminal": True, "process": "two"},
        ],
        allow_pickle=True,  # an object that pickles but does not unpickle
    )
    pipe = launch(loop, path, run_dir=tmp_path / "run")
    try:
        with pytest.raises(omnictl.RequestFailed, match=r"stage 'b' could not take its input"):
            loop.run(_result(pipe, {"picky": True}))
        def stage_b() -> Any:
            return pipe.profile.aggregator.snapshot().stages.get("b")

        assert until(lambda: stage_b() is not None and stage_b().rejected == 1)
        assert stage_b().failed == 0
    finally:
        loop.run(pipe.close())
