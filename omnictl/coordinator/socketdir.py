"""The directory of a pipeline's ZeroMQ ``ipc://`` sockets: private, and never left behind
for long.

It is created owner-only (0700, as ``mkdtemp`` does), so no other local user can connect
to a stage. Its name carries the creating process's pid: a server killed with SIGKILL
cannot remove its own, so the next pipeline to start removes every such directory whose
creator is gone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from omnictl.pids import alive

PREFIX = "omnictl-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
log = logging.getLogger(__name__)


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove socket directories, owned by this user, whose creating process has exited."""
    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    for entry in root.glob(f"{PREFIX}*"):
        match = _NAME.match(entry.name)
        try:
            owned = entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
        except FileNotFoundError:
            continue
        if match and owned and not alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    if removed:
        log.info("removed %d socket directories left by servers that were killed", len(removed))
    return removed


def create(root: Path | None = None) -> Path:
    """A new owner-only socket directory, after sweeping stale ones."""
    sweep_stale(root)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
