"""The launch knobs as one value: checked once, replaced field by field, passed whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl import Pipeline
from omnictl.admission import Admission
from omnictl.launch_config import AdmissionConfig, FaultConfig, LaunchConfig, PlacementConfig, ProfilingConfig
from omnictl.topology import loads

TOPOLOGY = """
model_path: /models/from-topology
stages:
  - {name: a, factory: m.a, terminal: true}
"""


def test_defaults_are_those_of_pipeline_launch() -> None:
    config = LaunchConfig()
    assert (config.profiling.profile, config.request_timeout, config.ready_timeout, config.faults.max_restarts) == (
        True, 300.0, 120.0, 0)
    assert (config.placement.launcher, config.remote, config.admission.max_in_flight,
            config.admission.max_queue_wait) == ("local", False, None, 0.0)
    assert config.faults.replay_limit == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"launcher": "k8s"}, "launcher must be one of 'local', 'ray', 'threads', not 'k8s'"),
        ({"request_timeout": 0}, "request_timeout must be > 0 seconds, not 0"),
        ({"ready_timeout": -1.0}, "ready_timeout must be > 0 seconds, not -1.0"),
        ({"max_restarts": -1}, "max_restarts must be >= 0, not -1"),
        ({"replay_limit": -2}, "replay_limit must be >= 0, not -2"),
        ({"input_window": 0}, "input_window must be >= 1 chunk, not 0"),
        ({"input_wait": 0.0}, "input_wait must be > 0 seconds, not 0.0"),
    ],
)
def test_a_bad_knob_is_refused_naming_it(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaunchConfig.of(**changes)  # type: ignore[arg-type]  # the bad values are the point
    with pytest.raises(ValueError, match=message):
        LaunchConfig().replace(**changes)  # type: ignore[arg-type]  # the bad values are the point


def test_run_dir_is_a_path_and_replace_leaves_the_original_alone() -> None:
    config = LaunchConfig.of(run_dir="runs/x")  # a str, as a caller may pass
    assert config.profiling.run_dir == Path("runs/x")
    ray = config.replace(launcher="ray")
    assert (ray.remote, ray.profiling.run_dir, config.placement.launcher) == (True, Path("runs/x"), "local")
    with pytest.raises(AttributeError):
        config.placement.launcher = "ray"  # type: ignore[misc]  # frozen


def test_the_model_path_falls_back_to_the_topologys() -> None:
    topology = loads(TOPOLOGY)
    assert LaunchConfig().model_path_for(topology) == "/models/from-topology"
    assert LaunchConfig.of(model_path="/elsewhere").model_path_for(topology) == "/elsewhere"


def test_launch_takes_a_config_or_its_fields_and_keywords_replace_fields() -> None:
    topology = loads(TOPOLOGY)
    assert Pipeline.launch(topology, device="cpu").config == LaunchConfig.of(device="cpu")
    base = LaunchConfig.of(request_timeout=5.0, max_restarts=2)
    assert Pipeline.launch(topology, base).config is base
    assert Pipeline.launch(topology, base, max_restarts=0).config == LaunchConfig.of(request_timeout=5.0)
    with pytest.raises(TypeError, match="no_such_knob"):
        Pipeline.launch(topology, no_such_knob=1)  # type: ignore[call-arg]  # the unknown knob is the point
    with pytest.raises(ValueError, match="launcher must be"):
        Pipeline.launch(topology, launcher="elsewhere")  # refused before any process starts


def test_a_flat_name_replaces_its_parts_field_and_leaves_the_rest() -> None:
    config = LaunchConfig.of(max_restarts=2, max_in_flight=8, run_dir="r", data_host="10.0.0.1", device="cpu")
    assert config.faults == FaultConfig(max_restarts=2)
    assert config.admission == AdmissionConfig(max_in_flight=8)
    assert config.profiling == ProfilingConfig(run_dir=Path("r"))
    assert config.placement == PlacementConfig(data_host="10.0.0.1")
    assert config.device == "cpu" and config.audio_policy == "fifo"
    assert config.replace(replay_limit=0).faults == FaultConfig(max_restarts=2, replay_limit=0)
    with pytest.raises(TypeError, match="LaunchConfig has no knob 'faults'"):
        config.replace(faults=FaultConfig())  # type: ignore[call-arg]  # a part goes whole through dataclasses.replace


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_in_flight": 0}, r"max_in_flight must be at least 1 \(or None: no limit\), got 0"),
        ({"max_queue_wait": -1.0}, "max_queue_wait must be 0 or more seconds, got -1.0"),
        ({"audio_policy": "loudest"}, "audio_policy must be one of fifo, deadline, got 'loudest'"),
    ],
)
def test_launch_refuses_a_bad_part_before_any_process_starts(changes: dict[str, object], message: str) -> None:
    # the part checks itself as it is made: Pipeline.launch builds no Admission to check it
    with pytest.raises(ValueError, match=message):
        Pipeline.launch(loads(TOPOLOGY), **changes)  # type: ignore[arg-type]  # the bad values are the point


def test_the_admission_and_its_config_refuse_by_one_rule() -> None:
    for bad in ({"max_in_flight": 0}, {"max_queue_wait": -0.5}):
        with pytest.raises(ValueError) as by_config:
            AdmissionConfig(**bad)  # type: ignore[arg-type]  # the bad values are the point
        with pytest.raises(ValueError) as by_admission:
            Admission(**bad)  # type: ignore[arg-type]  # the bad values are the point
        assert str(by_config.value) == str(by_admission.value)
    admission = Admission.of(AdmissionConfig(max_in_flight=3, max_queue_wait=0.25))
    assert (admission.max_in_flight, admission.max_queue_wait, admission.in_flight) == (3, 0.25, 0)
