"""The weights cache: built once from a fingerprint of its sources, shared by every install
of the same packages, never left half-built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnictl.models.voice_assistant.cache import MARKER, build_once, source_fingerprint


def _source(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True)
    path = folder / "weights.bin"
    path.write_bytes(data)
    return path


def test_the_same_package_in_another_environment_reuses_the_build(tmp_path: Path) -> None:
    first = _source(tmp_path / "venv-a" / "site-packages" / "pkg", b"x" * 10)
    second = _source(tmp_path / "venv-b" / "site-packages" / "pkg", b"y" * 10)
    builds: list[Path] = []

    def build(staging: Path) -> None:
        builds.append(staging)
        (staging / "model").write_text("built")

    target = tmp_path / "cache" / "model"
    assert build_once(target, source_fingerprint([first]), build, "the model") == target
    assert build_once(target, source_fingerprint([second]), build, "the model") == target
    assert len(builds) == 1  # a second checkout's venv does not rebuild (and so replace) the folder
    assert json.loads((target / MARKER).read_text()) == {"weights.bin": 10}


def test_a_source_of_another_size_rebuilds(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"
    old = _source(tmp_path / "old", b"x" * 10)
    new = _source(tmp_path / "new", b"x" * 11)
    build_once(target, source_fingerprint([old]), lambda staging: (staging / "v").write_text("1"), "the model")
    build_once(target, source_fingerprint([new]), lambda staging: (staging / "v").write_text("2"), "the model")
    assert (target / "v").read_text() == "2"


def test_a_failed_build_leaves_neither_the_folder_nor_its_staging(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"

    def broken(staging: Path) -> None:
        (staging / "half").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(target, {"weights.bin": 1}, broken, "the model")
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock"]
