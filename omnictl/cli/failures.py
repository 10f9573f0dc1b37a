"""Start-up failures as the operator reads them: one line (plus a hint), never a traceback.

A failure whose message carries a traceback (a stage factory raised something unforeseen)
is cut to its first line and the traceback's last line (the exception itself); the whole
of it goes to a log file, whose path is printed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import platformdirs
from rich.console import Console
from rich.text import Text


def log_dir() -> Path:
    return Path(platformdirs.user_log_dir("omnictl"))


def report_failure(console: Console, error: BaseException, command: str) -> None:
    from omnictl.exceptions import TopologyError

    if isinstance(error, TopologyError):  # every problem as `validate` prints it, no traceback to log
        console.print(
            Text.assemble(("error: ", "red"), f"{error.path}: {len(error.issues)} problem(s)"), soft_wrap=True
        )
        for issue in error.issues:
            console.print(issue.format(), soft_wrap=True, highlight=False, markup=False)
        return
    message = str(error)
    first, _, rest = message.partition("\n")
    if not rest.strip():
        console.print(Text.assemble(("error: ", "red"), first), soft_wrap=True)
        return
    cause = rest.strip().splitlines()[-1].strip()
    log = log_dir() / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(message + "\n", encoding="utf-8")
    console.print(Text.assemble(("error: ", "red"), f"{first}: {cause}"), soft_wrap=True)
    console.print(f"  the full traceback is in {log}", soft_wrap=True, highlight=False, markup=False)
