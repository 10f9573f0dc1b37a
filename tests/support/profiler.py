"""A profiler test double: keeps every record it is told, in order, for a test to read."""

from __future__ import annotations

from typing import Any

from omnictl.profiling.events import EventKind


class RecordingProfiler:
    def __init__(self) -> None:
        self.events: list[tuple[EventKind, str, str | None, dict[str, Any]]] = []

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: Any) -> None:
        self.events.append((kind, request_id, stage, meta))

    def kinds(self, request_id: str | None = None) -> list[EventKind]:
        """The kinds recorded, in order (of ``request_id``'s records only, when given)."""
        return [kind for kind, rid, _, _ in self.events if request_id is None or rid == request_id]
