from __future__ import annotations

import time
from typing import Callable


def until(condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes; returns whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
