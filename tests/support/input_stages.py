"""Stages for streamed-input tests: schedulers that record the stream chunks they receive.

A test streams chunks ``{"i": k, "blob": array filled with k}``; each stage checks every
chunk's blob against its ``i`` (a slot reused too early shows as a wrong fill) and records
the order and the sources it saw."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)


def chunk(i: int, size: int) -> dict[str, Any]:
    """The ``i``-th chunk: ``size`` float32 samples equal to ``i`` (over 16 KiB: in a slot)."""
    return {"i": i, "blob": np.full(size, i, dtype=np.float32)}


class _Seen:
    def __init__(self) -> None:
        self.order: list[int] = []
        self.sources: set[str] = set()
        self.corrupt = 0  # chunks whose blob does not hold their own index


class Recorder(Scheduler):
    """Records each request's stream chunks; on its stream's end returns ``{"order",
    "sources", "corrupt"}``. ``echo``: also streams each chunk on (to ``stream_to`` targets,
    and to the caller on a terminal). ``upstream``: the stream ends with the upstream's
    result (a ``stream_to`` and ``next`` target), returned beside the record as
    ``upstream``. ``work_s``: how long each chunk takes (a slow stage)."""

    def __init__(self, echo: bool = False, upstream: bool = False, work_s: float = 0.0) -> None:
        super().__init__()
        self.echo = echo
        self.upstream = upstream
        self.work_s = work_s
        self.seen: dict[str, _Seen] = {}
        self.ended = RecentIds()

    async def run(self) -> None:
        while True:
            await self._next()  # no local here: an idle loop would keep the last chunk's slot

    async def _next(self) -> None:
        message = await self.inbox.get()
        if self.work_s:  # a slow model: the inbox fills behind it while the loop stays free
            await asyncio.sleep(self.work_s)
        self._take(message)

    def _take(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self.ended:  # aborted while this one was being worked on
            return
        if message.kind is IncomingKind.STREAM_CHUNK:
            seen = self.seen.setdefault(rid, _Seen())
            data = message.data
            seen.order.append(int(data["i"]))
            seen.sources.add(str(message.source))
            if not np.all(np.asarray(data["blob"]) == data["i"]):
                seen.corrupt += 1
            if self.echo:
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, data))
        elif (message.kind is IncomingKind.STREAM_DONE) is not self.upstream:
            seen = self.seen.pop(rid, _Seen())
            result = {"order": seen.order, "sources": sorted(seen.sources), "corrupt": seen.corrupt}
            if self.upstream:
                result["upstream"] = message.data
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def abort(self, request_id: str) -> None:
        self.seen.pop(request_id, None)
        self.ended.add(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(queued=self.inbox.qsize(), stream_buffers=len(self.seen))


def recorder(echo: bool = False, upstream: bool = False, work_s: float = 0.0) -> Recorder:
    return Recorder(echo, upstream, work_s)
