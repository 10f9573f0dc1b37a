"""omnictl.models.checkpoint_parts: the Qwen families' load-once cache and checkpoint check."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.exceptions import ModelPathError
from omnictl.models.checkpoint_parts import CheckpointParts, checkpoint_dir


def _check(model_path: str | Path | None) -> Path:
    return checkpoint_dir(model_path, model="Tiny", flag="--model-path", writer="tiny.writer")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_each_part_is_built_once_per_checkpoint_part_and_device(checkpoint: Path) -> None:
    parts = CheckpointParts(_check)
    built: list[tuple[Path, str]] = []

    def build(path: Path, device: str) -> object:
        built.append((path, device))
        return object()

    first = parts.once(checkpoint, "thinker", None, build)
    # cpu named is the default device: the same part.
    assert parts.once(str(checkpoint), "thinker", "cpu", build) is first
    assert parts.once(checkpoint, "talker", None, build) is not first
    assert parts.once(checkpoint, "thinker", "meta", build) is not first
    assert built == [(checkpoint, "cpu"), (checkpoint, "cpu"), (checkpoint, "meta")]


def test_a_part_may_load_another_while_it_is_built(checkpoint: Path) -> None:
    parts = CheckpointParts(_check)
    config = parts.once(checkpoint, "config", None, lambda path, device: {"config": 1})
    talker = parts.once(checkpoint, "talker", None, lambda path, device: parts.once(path, "config", None, dict))
    assert talker is config


def test_no_path_and_a_directory_without_the_files_are_named(tmp_path: Path) -> None:
    parts = CheckpointParts(_check)
    with pytest.raises(ModelPathError, match=r"Tiny stages need a local checkpoint directory") as none:
        parts.once(None, "thinker", None, lambda path, device: None)
    assert "--model-path DIR" in str(none.value.hint)
    with pytest.raises(
        ModelPathError, match=r"--model-path '.*' is not a Tiny checkpoint directory \(no config.json\)"
    ):
        parts.once(tmp_path, "thinker", None, lambda path, device: None)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelPathError, match=r"\(no spk_dict.pt\)") as missing:
        checkpoint_dir(
            tmp_path, model="Tiny", flag="--model", writer="tiny.writer", required=("config.json", "spk_dict.pt")
        )
    assert "python -m tiny.writer DIR" in str(missing.value.hint)
