"""Plain-function stages for examples, tests and benchmarks.

Every function here is a real stage: a topology names it as a factory (which returns
the function itself) and the runtime wraps it in the simple scheduler.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

import numpy as np

from omnictl.outputs import AudioResult


def identity() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Factory of the no-op stage: returns its input."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        return data

    return run


def append(tag: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Appends ``tag`` to ``data["trail"]``: shows which stages a request crossed."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "trail": [*data.get("trail", []), tag]}

    return run


def words(delay: float = 0.0) -> Callable[[dict[str, Any]], Generator[dict[str, Any], None, dict[str, Any]]]:
    """Streams ``data["text"]`` word by word, then returns its input."""

    def run(data: dict[str, Any]) -> Generator[dict[str, Any], None, dict[str, Any]]:
        text = str(data.get("text", ""))
        for word in text.split():
            if delay:
                time.sleep(delay)
            yield {"text": word + " "}
        return data

    return run


def upper() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "text": str(data.get("text", "")).upper()}

    return run


def tone(seconds: float = 0.2, frequency: float = 440.0, sample_rate: int = 16_000) -> Callable[[Any], AudioResult]:
    """Factory of an audio terminal that answers every request with a short sine tone."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    samples = (0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)

    def run(data: Any) -> AudioResult:
        return AudioResult(samples=samples, sample_rate=sample_rate)

    return run


def route_by_kind(data: dict[str, Any]) -> str | list[str] | None:
    """route_fn: sends the result to the stage(s) named by ``data["route"]``."""
    return data.get("route")


def merge_dicts(inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """merge_fn: one dict with every upstream's result under its stage name."""
    merged: dict[str, Any] = {"sources": sorted(inputs)}
    for source, data in inputs.items():
        merged[source] = data
    return merged


def drop_hidden(data: dict[str, Any]) -> dict[str, Any]:
    """Projection: the text path does not need hidden states."""
    return {k: v for k, v in data.items() if k != "hidden"}


def fail_on(word: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Raises when the input text contains ``word``; echoes otherwise."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        if word in str(data.get("text", "")):
            raise ValueError(f"refusing input containing {word!r}")
        return data

    return run


def sleep(seconds: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Holds each request for ``seconds`` (to test aborts and deadlines mid-flight)."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        time.sleep(seconds)
        return data

    return run
