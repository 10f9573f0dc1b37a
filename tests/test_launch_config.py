"""The launch knobs as one value: checked once, replaced field by field, passed whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl import Pipeline
from omnictl.launch_config import LaunchConfig
from omnictl.topology import loads

TOPOLOGY = """
model_path: /models/from-topology
stages:
  - {name: a, factory: m.a, terminal: true}
"""


def test_defaults_are_those_of_pipeline_launch() -> None:
    config = LaunchConfig()
    assert (config.profile, config.request_timeout, config.ready_timeout, config.max_restarts) == (True, 300.0, 120.0, 0)
    assert (config.launcher, config.remote, config.max_in_flight, config.max_queue_wait) == ("local", False, None, 0.0)
    assert config.replay_limit == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"launcher": "k8s"}, "launcher must be one of 'local', 'ray', not 'k8s'"),
        ({"request_timeout": 0}, "request_timeout must be > 0 seconds, not 0"),
        ({"ready_timeout": -1.0}, "ready_timeout must be > 0 seconds, not -1.0"),
        ({"max_restarts": -1}, "max_restarts must be >= 0, not -1"),
        ({"replay_limit": -2}, "replay_limit must be >= 0, not -2"),
    ],
)
def test_a_bad_knob_is_refused_naming_it(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**changes)  # type: ignore[arg-type]  # the bad values are the point
    with pytest.raises(ValueError, match=message):
        LaunchConfig().replace(**changes)


def test_run_dir_is_a_path_and_replace_leaves_the_original_alone() -> None:
    config = LaunchConfig(run_dir="runs/x")  # type: ignore[arg-type]  # a str, as a caller may pass
    assert config.run_dir == Path("runs/x")
    ray = config.replace(launcher="ray")
    assert (ray.remote, ray.run_dir, config.launcher) == (True, Path("runs/x"), "local")
    with pytest.raises(AttributeError):
        config.launcher = "ray"  # type: ignore[misc]  # frozen


def test_the_model_path_falls_back_to_the_topologys() -> None:
    topology = loads(TOPOLOGY)
    assert LaunchConfig().model_path_for(topology) == "/models/from-topology"
    assert LaunchConfig(model_path="/elsewhere").model_path_for(topology) == "/elsewhere"


def test_launch_takes_a_config_or_its_fields_and_keywords_replace_fields() -> None:
    topology = loads(TOPOLOGY)
    assert Pipeline.launch(topology, device="cpu").config == LaunchConfig(device="cpu")
    base = LaunchConfig(request_timeout=5.0, max_restarts=2)
    assert Pipeline.launch(topology, base).config is base
    assert Pipeline.launch(topology, base, max_restarts=0).config == LaunchConfig(request_timeout=5.0)
    with pytest.raises(TypeError, match="no_such_knob"):
        Pipeline.launch(topology, no_such_knob=1)
    with pytest.raises(ValueError, match="launcher must be"):
        Pipeline.launch(topology, launcher="elsewhere")  # refused before any process starts
