"""A bounded memory of recently finished request ids.

Stages, schedulers and the coordinator all need to answer "did this request already
finish here?" so that messages still in flight when it finished (late stream chunks,
an upstream result that overtook them, a reused id) are dropped instead of starting
it again. They cannot remember every id forever, so they remember the most recent
ones. This module must stay import-light: the coordinator and the CLI import it.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_RECENT_IDS", "RecentIds"]

# Late messages for a finished request are ones already in flight when it finished:
# they arrive within milliseconds, a few seconds under heavy load. 4096 ids cover that
# window even at 1000 finished requests per second for 4 s, and cost under 1 MB
# (a short string plus an OrderedDict entry each) per holder.
DEFAULT_RECENT_IDS = 4096


class RecentIds:
    """The last ``capacity`` request ids added; older ones are forgotten, oldest first.

    Re-adding an id already held refreshes it: it becomes the newest again, because the
    request just finished (or was aborted) once more here, so late messages for it may
    again be in flight.
    """

    __slots__ = ("capacity", "_ids")

    def __init__(self, capacity: int = DEFAULT_RECENT_IDS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        """Remember ``request_id`` as the newest; forget the oldest beyond ``capacity``."""
        self._ids[request_id] = None
        self._ids.move_to_end(request_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"RecentIds({len(self._ids)}/{self.capacity})"
