"""Building a stage from its spec: the factory's arguments (model_path and device only when it
takes them, the topology's own values first), what it may return, and the hooks it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omnictl.exceptions import ResolveError
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.build import build_stage, make_scheduler
from omnictl.topology import load
from omnictl.topology.model import Topology

F = "tests.stage.build_factories"


def topology(tmp_path: Path, stage_a: str) -> Topology:
    path = tmp_path / "t.yaml"
    path.write_text(f"stages:\n{stage_a}\n  - {{name: b, factory: {F}.echo, terminal: true}}\n")
    return load(path)


def built(tmp_path: Path, stage_a: str, model_path: str | None = None) -> Any:
    """What stage `a`'s function returns for the input 1, built with ``model_path``."""
    topo = topology(tmp_path, stage_a)
    scheduler = make_scheduler(topo.stages["a"], topo, model_path)
    assert isinstance(scheduler, SimpleScheduler)
    return scheduler.fn(1)


def test_a_function_factory_gets_its_args_and_runs_in_a_simple_scheduler(tmp_path: Path) -> None:
    stage = f"  - {{name: a, factory: {F}.echo, factory_args: {{tag: x}}, next: [b]}}"
    assert built(tmp_path, stage, model_path="/weights") == ("x", 1)  # echo takes no model_path: none given


def test_model_path_and_device_reach_a_factory_that_takes_them(tmp_path: Path) -> None:
    stage = f"  - {{name: a, factory: {F}.placed, next: [b]}}"
    assert built(tmp_path, stage, model_path="/weights") == {"model_path": "/weights", "device": "cpu"}
    assert built(tmp_path, stage) == {"model_path": None, "device": "cpu"}  # no model path: the factory's default
    assert built(tmp_path, f"  - {{name: a, factory: {F}.anything, next: [b]}}", "/w") == {"model_path": "/w", "device": "cpu"}


def test_the_topology_s_own_factory_args_win_over_model_path_and_device(tmp_path: Path) -> None:
    stage = f"  - {{name: a, factory: {F}.placed, factory_args: {{model_path: /mine, device: meta}}, next: [b]}}"
    assert built(tmp_path, stage, model_path="/weights") == {"model_path": "/mine", "device": "meta"}


def test_a_scheduler_from_the_factory_is_used_as_it_is(tmp_path: Path) -> None:
    topo = topology(tmp_path, f"  - {{name: a, factory: {F}.scheduler, next: [b]}}")
    scheduler = make_scheduler(topo.stages["a"], topo, None)
    assert isinstance(scheduler, SimpleScheduler) and scheduler.fn(5) == 5


def test_a_factory_returning_neither_a_scheduler_nor_a_callable_is_named(tmp_path: Path) -> None:
    topo = topology(tmp_path, f"  - {{name: a, factory: {F}.broken, next: [b]}}")
    with pytest.raises(TypeError) as caught:
        make_scheduler(topo.stages["a"], topo, None)
    assert str(caught.value) == (f"factory {F}.broken of stage 'a' returned int; expected a Scheduler or a callable")


def test_the_stage_gets_its_merge_route_and_projections(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "stages:\n"
        f"  - {{name: a, factory: {F}.echo, next: [b, c], route_fn: {F}.route, project: {{b: {F}.to_b}}}}\n"
        f"  - {{name: c, factory: {F}.echo, next: [b]}}\n"
        f"  - {{name: b, factory: {F}.echo, wait_for: [a, c], merge_fn: {F}.merge, terminal: true}}\n")
    topo = load(path)
    a = build_stage(topo.stages["a"], topo, None, None, None)  # type: ignore[arg-type]  # never sends: built only
    b = build_stage(topo.stages["b"], topo, None, None, None)  # type: ignore[arg-type]
    assert a.name == "a" and a.router.route_fn is not None and a.router.route_fn(0) == ["b"]
    assert set(a.router.projections) == {"b"} and a.router.projections["b"](1) == {"for_b": 1}
    assert a.fanin.upstreams == () and a.fanin.merge is None
    assert b.fanin.upstreams == ("a", "c") and b.fanin.merge is not None and b.fanin.merge({"c": 1, "a": 2}) == ["a", "c"]
    assert b.router.route_fn is None and b.router.projections == {}


def test_a_hook_that_does_not_resolve_names_the_file_line_field_and_stage(tmp_path: Path) -> None:
    topo = topology(tmp_path, f"  - {{name: a, factory: {F}.echo, next: [b], route_fn: {F}.nowhere}}")
    with pytest.raises(ResolveError) as caught:
        build_stage(topo.stages["a"], topo, None, None, None)  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"{tmp_path / 't.yaml'}:2" in message and "`route_fn` of stage 'a'" in message and "nowhere" in message


def test_a_factory_beside_the_topology_file_is_found_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    (tmp_path / "beside_factories.py").write_text("def make():\n    return lambda data: ('beside', data)\n")
    monkeypatch.delitem(sys.modules, "beside_factories", raising=False)
    topo = topology(tmp_path, "  - {name: a, factory: beside_factories.make, next: [b]}")
    scheduler = make_scheduler(topo.stages["a"], topo, None)
    assert isinstance(scheduler, SimpleScheduler) and scheduler.fn(2) == ("beside", 2)
    sys.modules.pop("beside_factories", None)


def test_a_tensor_parallel_stage_is_built_as_rank_0_of_its_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omnictl.stage import tp_group

    led: list[Any] = []

    def lead(spec: Any, topology_: Any, model_path: Any, build: Any) -> Any:
        led.append((spec.name, topology_, model_path))
        return build()  # the factory, called as rank 0 calls it

    monkeypatch.setattr(tp_group, "lead", lead)
    topo = topology(tmp_path, f"  - {{name: a, factory: {F}.anything, tp_size: 2, next: [b]}}")
    scheduler = make_scheduler(topo.stages["a"], topo, "/w", audio_policy="deadline")
    assert led == [("a", topo, "/w")]
    assert isinstance(scheduler, SimpleScheduler)
    assert scheduler.fn(1) == {"model_path": "/w", "device": "cpu", "audio_policy": "deadline"}
    make_scheduler(topo.stages["b"], topo, "/w")  # one rank: no group
    assert len(led) == 1
