"""One assertion for every leak test: the pipeline holds nothing for finished requests.

It reads :meth:`omnictl.Pipeline.held` — the coordinator's records and placement, admission's
slots, and every stage's per-request state — so a counter that only grows, anywhere, fails
the test that ends with it, naming where.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


def what_is_held(held: dict[str, dict[str, Any]]) -> list[str]:
    """``where.what=count`` for every non-zero figure (empty: nothing held)."""
    found = []
    for part, figures in held.items():
        if part == "stages":
            for stage, counters in figures.items():
                found += [f"stage {stage}.{key}={value}" for key, value in counters.items() if value]
        else:
            found += [f"{part}.{key}={value}" for key, value in figures.items() if value]
    return found


async def held_by(pipe: Any, timeout: float = 10.0) -> list[str]:
    """What ``pipe`` still holds once it has had ``timeout`` seconds to let go (empty: nothing).
    Releases travel back after results, so it polls rather than reading once."""
    deadline = time.monotonic() + timeout
    while True:
        left = what_is_held(await pipe.held(timeout=2.0))
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.05)
