"""Items handed from any thread to one consumer on an event loop, in order, with one
wake-up of the loop per burst instead of one per item.

Used where worker threads produce what only the loop may act on: a scheduler's outputs
(``Scheduler.emit``) and the shared-memory slots whose received views died
(``ViewLeases``). The pending flag is cleared *before* the queue is drained, so an item
put while a drain runs either is taken by that drain or schedules the next one: none is
left behind without a wake-up coming for it.
"""

from __future__ import annotations

import collections
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """``put`` from any thread; ``consume(item)`` runs for each item, in order, inside
    ``drain``, which ``wake(drain)`` schedules on the consumer's thread (e.g. the loop's
    ``call_soon_threadsafe``). ``drain`` may also be called directly on that thread."""

    def __init__(self, consume: Callable[[T], None], wake: Callable[[Callable[[], None]], object]) -> None:
        self._consume = consume
        self._wake = wake
        self._items: collections.deque[T] = collections.deque()  # append/popleft: atomic, no lock
        self._pending = False

    def put(self, item: T) -> None:
        """Queue ``item``; the first of a burst schedules a drain (``wake``'s errors, e.g.
        a closed loop's RuntimeError, propagate to the caller)."""
        self._items.append(item)
        if not self._pending:
            self._pending = True
            self._wake(self.drain)

    def drain(self) -> None:
        """Consume every item queued now (on the consumer's thread)."""
        self._pending = False  # first: an item put from now on schedules another drain
        items, consume = self._items, self._consume
        while items:
            consume(items.popleft())
