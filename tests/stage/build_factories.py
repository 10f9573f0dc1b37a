"""Factories for tests/stage/test_build.py: each reports what it was called with."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from omnictl.schedulers.simple import SimpleScheduler


def echo(tag: str = "") -> Callable[[Any], Any]:
    """A plain function stage (no model_path, no device taken)."""
    return lambda data: (tag, data)


def placed(model_path: str | None = None, device: str | None = None) -> Callable[[Any], Any]:
    return lambda data: {"model_path": model_path, "device": device}


def anything(**kwargs: Any) -> Callable[[Any], Any]:
    return lambda data: kwargs


def scheduler() -> SimpleScheduler:
    return SimpleScheduler(lambda data: data)


def broken() -> int:
    return 3


def merge(inputs: dict[str, Any]) -> Any:
    return sorted(inputs)


def route(data: Any) -> list[str]:
    return ["b"]


def to_b(data: Any) -> Any:
    return {"for_b": data}


def double() -> Callable[[Any], Any]:
    return lambda data: {"n": data["n"] * 2}


def slow() -> Callable[[Any], Any]:
    """A generator stage that streams for seconds: an abort stops it at its next chunk."""
    import time

    def run(data: Any) -> Any:
        for i in range(100):
            time.sleep(0.05)
            yield {"n": i}
        return {"n": -1}

    return run


def explode() -> Callable[[Any], Any]:
    raise RuntimeError("this factory cannot build its model")


def big() -> Callable[[Any], Any]:
    """An output over the inline threshold: it travels in a shared-memory slot."""
    import numpy as np

    return lambda data: {"samples": np.zeros(50_000, dtype=np.float32)}


def join(inputs: dict[str, Any]) -> Any:
    return {"from": sorted(inputs), "a": inputs.get("a")}


def upper() -> Any:
    """A stream consumer: each window of text, upper-cased, as it comes."""
    from omnictl.schedulers.streaming import StreamingScheduler

    return StreamingScheduler(lambda window: {"text": str(window.new).upper()}, units="text", chunk_size=2)


LOADING = threading.Event()  # set once loads_for_a_minute is inside its load


def loads_for_a_minute() -> Callable[[Any], Any]:
    """A stage whose model takes a minute to load (the worker's event loop blocked meanwhile)."""
    LOADING.set()
    time.sleep(60)
    return lambda data: data
