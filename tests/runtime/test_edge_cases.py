"""Faults found in review: none of them may hang a request or leak state."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

import omnictl
from tests.support import topo
from tests.support.held import held_by
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Longer than the suite's default deadline: stage processes killed, restarted, relaunched, up to ~23 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

E = "omnictl.models.examples"
S = "tests.support.stages"


async def _result(pipe: Any, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return await (await pipe.submit(data, **kwargs)).result()


ODD = "tests.runtime.runtime_stages.odd_outputs"


def _odd_topology(path: Path, **options: Any) -> Path:
    """``a`` (process one) then ``b`` (process two, terminal): each passes a request on, or
    gives the odd output it names (``{"at": "a", "odd": "picky"}``: tests.runtime.runtime_stages)."""
    stages = [{"name": "a", "factory": ODD, "factory_args": {"name": "a"}, "next": ["b"], "process": "one"},
              {"name": "b", "factory": ODD, "factory_args": {"name": "b"}, "terminal": True, "process": "two"}]
    return topo.write(path, stages, **options)


@pytest.fixture(scope="module")
def typed(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One launch for the tests that kill nothing, on the typed wire encoding (no pickle)."""
    pipe = launch(loop, _odd_topology(tmp_path_factory.mktemp("typed") / "typed.yaml"), profile=False, launcher="threads")
    yield pipe
    loop.run(pipe.close())


@pytest.fixture(scope="module")
def trusted(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The same with ``allow_pickle``, profiled (the aggregator counts what each stage rejected)."""
    folder = tmp_path_factory.mktemp("trusted")
    pipe = launch(loop, _odd_topology(folder / "trusted.yaml", allow_pickle=True), run_dir=folder / "run")
    yield pipe
    loop.run(pipe.close())


def test_a_user_object_in_an_output_fails_its_request_naming_stage_path_and_type(
    loop: LoopThread, typed: Any, trusted: Any
) -> None:
    with pytest.raises(omnictl.RequestFailed) as caught:
        loop.run(_result(typed, {"at": "a", "odd": "user_object", "value": 7}))
    message = str(caught.value)
    assert "stage 'a' could not send its output" in message
    assert "['out'][1]['thing']" in message and "tests.support.stages.UserThing" in message
    assert loop.run(typed.stats())["a"]["requests"] == 0
    from tests.support.stages import UserThing

    assert loop.run(_result(trusted, {"at": "a", "odd": "user_object", "value": 7}))["b"] == {
        "out": [1, {"thing": UserThing(7)}]}


def test_outputs_that_cannot_cross_a_process_fail_their_request_only(loop: LoopThread, trusted: Any) -> None:
    with pytest.raises(omnictl.RequestFailed, match=r"stage 'a' could not send its output: .*pickle"):
        loop.run(_result(trusted, {"at": "a", "odd": "lambda"}))
    with pytest.raises(omnictl.RequestFailed, match=r"output of stage 'b' could not be decoded"):
        loop.run(_result(trusted, {"at": "b", "odd": "picky"}))
    assert loop.run(_result(trusted, {"text": "fine"}))["b"]["text"] == "fine"
    stats = loop.run(trusted.stats())
    assert all(entry["requests"] == 0 for entry in stats.values())


def test_inputs_that_cannot_be_sent_leave_no_request_behind(loop: LoopThread, typed: Any) -> None:
    with pytest.raises(omnictl.UnsupportedPayload, match=r"\['fn'\]: a builtins.function"):
        loop.run(typed.submit({"fn": lambda: None}, request_id="r1"))
    assert typed.in_flight() == 0
    assert loop.run(held_by(typed)) == []  # no admission slot, no placement, no record kept
    assert loop.run(_result(typed, {"x": 1}, request_id="r1")) == {"b": {"x": 1}}


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


def test_a_stage_that_cannot_take_its_input_counts_as_rejected_there(loop: LoopThread, trusted: Any) -> None:
    def stage_b() -> Any:
        return trusted.profile.aggregator.snapshot().stages.get("b")

    # the module's other tests share the pipeline: what they made b count is the baseline
    before = (stage_b().rejected, stage_b().failed) if stage_b() is not None else (0, 0)
    with pytest.raises(omnictl.RequestFailed, match=r"stage 'b' could not take its input"):
        loop.run(_result(trusted, {"at": "a", "odd": "picky"}))  # pickled by a, not unpickled by b
    assert until(lambda: stage_b() is not None and stage_b().rejected == before[0] + 1)
    assert stage_b().failed == before[1]
