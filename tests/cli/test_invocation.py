"""The commands omnictl suggests are typed the way the user started it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omnictl.cli.invocation import program
from omnictl.serving.ready import ready_message
from rich.console import Console


def _fake_omnictl(folder: Path) -> Path:
    folder.mkdir()
    exe = folder / "omnictl"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def test_a_venv_not_on_path_is_named_by_the_path_typed(tmp_path: Path) -> None:
    exe = _fake_omnictl(tmp_path / "bin")
    os.chdir(tmp_path)
    assert program("bin/omnictl", path="/nonexistent") == "bin/omnictl"
    assert program(str(exe), path="/nonexistent") == str(exe)


def test_the_omnictl_on_path_is_plain_omnictl(tmp_path: Path) -> None:
    exe = _fake_omnictl(tmp_path / "bin")
    assert program(str(exe), path=str(exe.parent)) == "omnictl"
    assert program("omnictl", path=str(exe.parent)) == "omnictl"


def test_another_omnictl_on_path_does_not_count(tmp_path: Path) -> None:
    mine = _fake_omnictl(tmp_path / "venv")
    other = _fake_omnictl(tmp_path / "elsewhere")
    assert program(str(mine), path=str(other.parent)) == str(mine)


def test_started_as_a_module() -> None:
    assert program("/x/omnictl/cli/main.py").endswith(" -m omnictl.cli.main")
    assert sys.executable in program("/x/omnictl/cli/main.py") or "'" in program("/x/omnictl/cli/main.py")


def test_serve_prints_the_hints_as_invoked() -> None:
    console = Console(width=400, record=True)
    console.print(ready_message("http://127.0.0.1:8000", "m", {"out": "text"}, 1, 1, None, "/runs/r1",
                                program=".venv/bin/omnictl"))
    text = console.export_text()
    assert ".venv/bin/omnictl bench --url http://127.0.0.1:8000" in text
    assert ".venv/bin/omnictl trace REQUEST_ID" in text
    assert " omnictl bench" not in text.replace(".venv/bin/omnictl bench", "")
