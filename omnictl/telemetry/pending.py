"""A request's profiling events, held from its first event until its trace is complete.

The coordinator records a request's end (completed, failed, aborted) as soon as it knows;
the stages' own last events ship from their processes a moment later (every recorder
flushes every 50 ms). So a request is handed out ``grace_s`` after its end arrived, with
whatever came in meanwhile; what arrives later still is dropped (its id is remembered).

Bounded whatever the traffic: at most ``max_requests`` requests held (the oldest is given
up beyond that), ``max_events`` events each and ``max_total_events`` in all (the rest are
counted in the request's ``truncated``; its trace says so).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from omnictl.profiling.events import Event, EventKind
from omnictl.recent import RecentIds

_ENDS = frozenset({EventKind.COMPLETED, EventKind.FAILED, EventKind.ABORTED})
GRACE_S = 1.0
MAX_REQUESTS = 10_000
MAX_EVENTS = 10_000
MAX_TOTAL_EVENTS = 200_000  # a few hundred bytes each: tens of MB at most


@dataclass
class _Held:
    events: list[Event] = field(default_factory=list)
    truncated: int = 0
    due: float | None = None  # monotonic time to hand it out; None until its end arrived


@dataclass(frozen=True)
class Finished:
    request_id: str
    events: list[Event]
    truncated: int  # events dropped because the request had more than max_events


class PendingTraces:
    def __init__(
        self,
        grace_s: float = GRACE_S,
        max_requests: int = MAX_REQUESTS,
        max_events: int = MAX_EVENTS,
        max_total_events: int = MAX_TOTAL_EVENTS,
    ) -> None:
        self.grace_s = grace_s
        self.max_requests = max_requests
        self.max_events = max_events
        self.max_total_events = max_total_events
        self.total_events = 0  # held now, all requests together
        self.given_up = 0  # requests dropped unfinished because too many were held
        self._held: dict[str, _Held] = {}
        self._done = RecentIds()  # handed out: their late events are dropped
        # (due time, id) in the order ends arrived: with one grace period, also in due order.
        self._due: deque[tuple[float, str]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def add(self, events: Iterable[Event], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for event in events:
            rid = event.request_id
            if not rid or rid in self._done:
                continue  # bookkeeping (a recorder's drops), or late for a request already handed out
            held = self._held.get(rid)
            if held is None:
                if len(self._held) >= self.max_requests:
                    oldest = self._held.pop(next(iter(self._held)))
                    self.total_events -= len(oldest.events)
                    self.given_up += 1
                held = self._held[rid] = _Held()
            # The end is kept whatever the caps: it says how the request ended.
            if event.kind in _ENDS or (
                len(held.events) < self.max_events and self.total_events < self.max_total_events
            ):
                held.events.append(event)
                self.total_events += 1
            else:
                held.truncated += 1
            if event.kind in _ENDS and held.due is None:
                held.due = now + self.grace_s
                self._due.append((held.due, rid))

    def take_due(self, now: float | None = None) -> list[Finished]:
        """The requests whose grace period is over, removed from the table."""
        now = time.monotonic() if now is None else now
        taken = []
        while self._due and self._due[0][0] <= now:
            rid = self._due.popleft()[1]
            if rid in self._held:  # else given up meanwhile
                taken.append(self._take(rid))
        return taken

    def take_ended(self) -> list[Finished]:
        """Every request that has ended, grace or not (shutting down: nothing more will come)."""
        self._due.clear()
        return [self._take(rid) for rid in [r for r, held in self._held.items() if held.due is not None]]

    def _take(self, request_id: str) -> Finished:
        held = self._held.pop(request_id)
        self.total_events -= len(held.events)
        self._done.add(request_id)
        return Finished(request_id, held.events, held.truncated)
