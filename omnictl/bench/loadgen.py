"""Closed loop (a fixed number of requests in flight) or open loop (Poisson arrivals)."""

from __future__ import annotations

import asyncio
import random
from typing import Awaitable, Callable

from omnictl.bench.stats import RequestRecord

Send = Callable[[int], Awaitable[RequestRecord]]


async def closed_loop(
    send: Send, count: int, concurrency: int, on_done: Callable[[RequestRecord], None]
) -> list[RequestRecord]:
    """``concurrency`` workers; each sends its next request as soon as the last one ends."""
    records: list[RequestRecord] = []
    indices = iter(range(count))

    async def worker() -> None:
        for index in indices:  # a shared iterator: each index is taken by exactly one worker
            record = await send(index)
            records.append(record)
            on_done(record)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return sorted(records, key=lambda r: r.index)


async def open_loop(
    send: Send, count: int, rate: float, on_done: Callable[[RequestRecord], None], seed: int = 0
) -> list[RequestRecord]:
    """Requests arrive as a Poisson process at ``rate`` per second, whether or not earlier ones finished."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[RequestRecord]] = []

    async def one(index: int) -> RequestRecord:
        record = await send(index)
        on_done(record)
        return record

    for index in range(count):
        tasks.append(asyncio.create_task(one(index)))
        if index + 1 < count:
            # this wait *is* the workload (the gap between arrivals), not a synchronisation
            await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))
