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


def odd_outputs(name: str) -> Callable[[Any], Any]:
    """Passes each request on, unless it names this stage (``{"at": name, "odd": kind}``):
    then its output is what ``kind`` says, one the wire cannot carry or a reader cannot
    take: ``lambda`` (does not pickle), ``picky`` (pickles, does not unpickle),
    ``user_object`` (an object of a user class, ``UserThing(data["value"])``)."""
    from tests.support.stages import Picky, UserThing

    def run(data: Any) -> Any:
        if not isinstance(data, dict) or data.get("at") != name:
            return data
        kind = data["odd"]
        if kind == "lambda":
            return {"fn": lambda: None}
        if kind == "picky":
            return {"error": Picky(1, 2)}
        if kind == "user_object":
            return {"out": [1, {"thing": UserThing(data["value"])}]}
        raise ValueError(f"no odd output {kind!r}")

    return run
