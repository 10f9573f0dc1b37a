"""`tp_size` > 1 validates (the language has it) but the runtime does not implement tensor
parallelism yet: launching refuses it, before any process starts, instead of silently
running the stage on its first GPU; `omnictl validate` warns."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from omnictl import Pipeline
from omnictl.cli.validate import register
from omnictl.exceptions import LaunchError, OmnictlError
from omnictl.coordinator.launcher import refuse_unsupported
from omnictl.topology import load, loads

TP = """\
stages:
  - name: prep
    factory: omnictl.models.examples.identity
    next: [big]
  - name: big
    factory: omnictl.models.examples.identity
    gpu: [0, 1]
    terminal: true
"""


@pytest.fixture
def tp_file(tmp_path: Path) -> Path:
    path = tmp_path / "tp.yaml"
    path.write_text(TP)
    return path


def test_launching_a_tensor_parallel_stage_fails_before_spawning(tp_file: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        Pipeline.launch(tp_file, profile=False)  # raises here: nothing has been started
    error = caught.value
    assert isinstance(error, OmnictlError) and error.stage == "big"
    assert "tensor parallelism is not implemented by this runtime yet" in str(error)
    assert f"{tp_file}:5" in str(error) and "tp_size=2 on GPUs [0, 1]" in str(error)


def test_a_loaded_topology_object_is_refused_too(tp_file: Path) -> None:
    with pytest.raises(LaunchError, match="tensor parallelism"):
        Pipeline.launch(load(tp_file), profile=False)


def test_on_cpu_the_placement_is_dropped_and_the_launch_goes_ahead(tp_file: Path) -> None:
    Pipeline.launch(tp_file, device="cpu", profile=False)  # not awaited: no process started
    Pipeline.launch(load(tp_file), device="cpu", profile=False)


def test_validate_accepts_it_with_a_warning(tp_file: Path) -> None:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A group, so `validate` is a subcommand."""

    register(app)
    result = CliRunner().invoke(app, ["validate", str(tp_file)])
    assert result.exit_code == 0, result.output
    assert f"{tp_file}:5: warning: stage 'big' has tp_size 2: tensor parallelism is not " \
           "implemented by this runtime yet" in " ".join(result.output.split())


def test_a_topology_from_text_is_refused_with_the_whole_message_and_no_file_prefix() -> None:
    topology = loads(TP.replace("gpu: [0, 1]", "gpu: [1, 2]"))  # no file: no "path:line: " in front
    with pytest.raises(LaunchError) as caught:
        refuse_unsupported(topology)
    assert str(caught.value) == (
        "stage 'big' failed to start: tensor parallelism is not implemented by this runtime yet: "
        "the stage asks for tp_size=2 on GPUs [1, 2], and would run on GPU 1 alone. Place it on one "
        "GPU (`gpu: N`), or launch with device='cpu' (--device cpu).")
