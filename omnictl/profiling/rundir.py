"""Run directories: where one run's trace and a description of its topology live.

Default runs go under the user's state directory, one folder per run, with a ``latest``
symlink next to them so ``omnictl trace`` finds the most recent run without flags.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import msgspec
import platformdirs

from omnictl.exceptions import TraceError  # re-exported here (and by the store) for callers
from omnictl.pids import alive
from omnictl.topology.model import Topology

RUN_INFO_FILE = "run.json"
_RUN_NAME = re.compile(r"\d{8}-\d{6}-\d+")  # what default_run_dir names a run
LATEST_LINK = "latest"


class StageInfo(msgspec.Struct, frozen=True):
    name: str
    process: str
    gpu: list[int]
    terminal: bool
    node: str | None = None  # its process's `node` label (None: the coordinator's machine)
    tp_size: int = 1  # ranks of its tensor-parallel group (1: no group)


class EdgeInfo(msgspec.Struct, frozen=True):
    src: str
    dst: str
    kind: str  # "data" or "stream"
    transport: str


class RunInfo(msgspec.Struct, frozen=True):
    """What ``run.json`` holds: enough to label a trace after the server is gone."""

    topology: str
    topology_path: str | None
    started_ns: int
    pid: int
    stages: list[StageInfo]
    edges: list[EdgeInfo]


def runs_root() -> Path:
    return Path(platformdirs.user_state_dir("omnictl")) / "runs"


def default_run_dir(keep: int = 10) -> Path:
    """Create ``<state dir>/runs/<YYYYmmdd-HHMMSS-pid>`` and point ``latest`` at it.

    Only the newest ``keep`` default runs are kept (each is bounded by the store's
    rotation), so serving day after day does not fill the disk; the run of a process
    that is still alive is never removed, however old.
    """
    root = runs_root()
    run_dir = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    mark_latest(run_dir)
    runs = default_runs()
    for old in runs[keep:]:
        if old != run_dir and not alive(_run_pid(old)):
            shutil.rmtree(old, ignore_errors=True)
    return run_dir


def default_runs() -> list[Path]:
    """The default run directories, newest first."""
    root = runs_root()
    if not root.is_dir():
        return []
    runs = [path for path in root.iterdir() if _RUN_NAME.fullmatch(path.name) and path.is_dir()]
    # by start time, then pid: the name sorts as a string only while pids have equal length
    return sorted(runs, key=lambda path: (path.name.rsplit("-", 1)[0], _run_pid(path)), reverse=True)


def _run_pid(run_dir: Path) -> int:
    return int(run_dir.name.rsplit("-", 1)[1])


def mark_latest(run_dir: Path) -> None:
    """Point ``runs/latest`` at ``run_dir`` (atomically, so readers never see no link)."""
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    temporary = root / f".{LATEST_LINK}-{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.resolve(), target_is_directory=True)
    os.replace(temporary, root / LATEST_LINK)


def resolve_run_dir(run_dir: Path | None) -> Path:
    """``run_dir`` if given, else the latest default run; a clear error when neither exists."""
    if run_dir is not None:
        if not run_dir.is_dir():
            raise TraceError(f"run directory {run_dir} does not exist")
        return run_dir
    latest = runs_root() / LATEST_LINK
    if not latest.exists():
        raise TraceError(
            f"no run found under {runs_root()}: start `omnictl serve` (or `omnictl bench`) first, or pass --run-dir DIR"
        )
    return latest.resolve()


def write_run_info(run_dir: Path, topology: Topology) -> RunInfo:
    info = RunInfo(
        topology=topology.name,
        topology_path=str(topology.path) if topology.path else None,
        started_ns=time.time_ns(),
        pid=os.getpid(),
        stages=[
            StageInfo(spec.name, spec.process, list(spec.gpu), spec.terminal, topology.node_of(spec.name), spec.tp_size)
            for spec in topology.stages.values()
        ],
        edges=[EdgeInfo(e.src, e.dst, e.kind.value, e.transport.value) for e in topology.edges],
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_INFO_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(info)))
    return info


def read_run_info(run_dir: Path) -> RunInfo | None:
    """The run's ``run.json``, or None when the run did not write one."""
    path = run_dir / RUN_INFO_FILE
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunInfo)
    except msgspec.DecodeError as error:
        raise TraceError(f"{path} is not a valid run description: {error}") from error
