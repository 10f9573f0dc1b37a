"""Stages for the runtime tests that share one launch per module: each request says how
long to hold it (``{"sleep": s}``), so one pipeline serves a quick test and a slow one."""

from __future__ import annotations

import time
from typing import Any, Callable


def sleep_as_asked(seconds: float = 0.0) -> Callable[[Any], Any]:
    """Holds each request for its own ``sleep`` (seconds), else ``seconds``."""

    def run(data: Any) -> Any:
        wanted = data.get("sleep", seconds) if isinstance(data, dict) else seconds
        time.sleep(float(wanted))
        return data

    return run
