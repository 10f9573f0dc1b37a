"""Whether a process id still names a live process (for cleaning up after a killed one), and
how a process ended, in words (the coordinator's launcher and a stage's tensor-parallel
group both say it)."""

from __future__ import annotations

import os
import signal


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: checks existence and permission, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def describe_exit(code: int | None) -> str:
    """A process's return code in words: "exit code 1", "killed by SIGKILL", "still running"."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
