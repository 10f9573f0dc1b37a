"""``build_stage`` hands the worker's model path and audio policy to the factory, and a hook
that does not resolve is named by its own field (``merge_fn``, ``project.<target>``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.exceptions import ResolveError
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.build import build_stage
from omnictl.topology import load

F = "tests.stage.build_factories"


def test_the_model_path_and_audio_policy_reach_the_factory(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"stages:\n  - {{name: a, factory: {F}.anything, terminal: true}}\n")
    topo = load(path)
    stage = build_stage(topo.stages["a"], topo, "/weights", None, None, audio_policy="interrupt")  # type: ignore[arg-type]  # built only
    assert isinstance(stage.scheduler, SimpleScheduler)
    assert stage.scheduler.fn(1) == {"model_path": "/weights", "device": "cpu", "audio_policy": "interrupt"}
    plain = build_stage(topo.stages["a"], topo, None, None, None)  # type: ignore[arg-type]
    assert isinstance(plain.scheduler, SimpleScheduler) and plain.scheduler.fn(1) == {"device": "cpu"}


@pytest.mark.parametrize(
    ("a", "b", "built", "field"),
    [
        ("", f"wait_for: [a], merge_fn: {F}.nowhere", "b", "3 `merge_fn` of stage 'b'"),
        (f"project: {{b: {F}.nowhere}}", "", "a", "2 `project.b` of stage 'a'"),
    ],
)
def test_a_merge_or_projection_that_does_not_resolve_is_named_by_its_field(
        tmp_path: Path, a: str, b: str, built: str, field: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "stages:\n"
        f"  - {{name: a, factory: {F}.echo, next: [b], {a}}}\n"
        f"  - {{name: b, factory: {F}.echo, terminal: true, {b}}}\n")
    topo = load(path)
    with pytest.raises(ResolveError) as caught:
        build_stage(topo.stages[built], topo, None, None, None)  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"{path}:{field}" in message and "nowhere" in message
