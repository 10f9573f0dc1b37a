"""Socket directories: owner-only, and those of killed servers swept at the next start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from omnictl.coordinator import socketdir


def test_a_new_directory_is_owner_only_and_named_after_its_creator(tmp_path: Path) -> None:
    made = socketdir.create(tmp_path)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert made.name.startswith(f"omnictl-{os.getpid()}-")


def test_directories_of_exited_creators_are_swept_others_kept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    stale = tmp_path / f"omnictl-{dead_pid}-abc"
    (stale / "control").mkdir(parents=True)
    live = tmp_path / f"omnictl-{os.getpid()}-def"
    live.mkdir()
    unrelated = tmp_path / "omnictl-notapid"
    unrelated.mkdir()
    assert socketdir.sweep_stale(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and unrelated.exists()
