"""One source for package data: ``omnictl/data`` is what the code reads, in a wheel and in a
checkout alike; the repository's ``schemas/`` and ``topologies/`` copies (kept for editors
and readers) must stay byte-identical to it, and the wheel must ship it."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest

from omnictl.data import DEFAULT_TOPOLOGY, SCHEMA, data_path
from omnictl.serving.server import default_topology
from omnictl.topology.schema import schema_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "omnictl" / "data"

COPIES = {
    SCHEMA: REPO / "schemas" / SCHEMA,
    DEFAULT_TOPOLOGY: REPO / "topologies" / DEFAULT_TOPOLOGY,
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_the_repository_copy_is_byte_identical_to_the_package_data(name: str) -> None:
    copy = COPIES[name]
    assert copy.read_bytes() == (DATA / name).read_bytes(), (
        f"{copy.relative_to(REPO)} differs from omnictl/data/{name}, which is what omnictl "
        f"reads: edit omnictl/data/{name} and copy it over")


def test_every_reader_finds_the_package_data() -> None:
    assert data_path(SCHEMA) == DATA / SCHEMA
    assert schema_path() == DATA / SCHEMA
    assert default_topology() == DATA / DEFAULT_TOPOLOGY


def test_the_wheel_ships_every_data_file() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["omnictl.data"]
    files = [p.relative_to(DATA).as_posix() for p in DATA.rglob("*")
             if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    assert files
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert unshipped == [], f"not in [tool.setuptools.package-data] omnictl.data: {unshipped}"


def test_default_topology_is_the_builtin_one_serve_runs() -> None:
    import omnictl
    from omnictl.topology import load

    path = omnictl.default_topology()
    assert path.is_file()
    assert path.read_bytes() == (Path(__file__).resolve().parents[1] / "topologies" / "voice-assistant.yaml").read_bytes()
    assert load(path).name == "voice-assistant"
