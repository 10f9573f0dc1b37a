"""Whether a process id still names a live process (for cleaning up after a killed one)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: checks existence and permission, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
