"""The overload benchmark's stage: a fixed amount of work per request, then one text result."""

from __future__ import annotations

import time
from typing import Any, Callable

from omnictl.outputs import TextResult


def think(seconds: float) -> Callable[[Any], TextResult]:
    def run(data: Any) -> TextResult:
        time.sleep(seconds)  # the GIL is released: stands in for a model's forward pass
        return TextResult(text="ok")

    return run
