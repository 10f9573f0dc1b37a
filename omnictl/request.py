"""A request's handle and its events, as a caller of :class:`omnictl.Pipeline` sees them.

``Pipeline.submit`` returns a :class:`RequestHandle`; its ``events()`` yields
:class:`RequestEvent` of a :class:`RequestEventKind`. The same names are on the top-level
package (``omnictl.RequestEventKind``), loaded lazily there; this module is the typed import.
"""

from __future__ import annotations

from omnictl.coordinator.request import RequestEvent, RequestEventKind, RequestHandle, RequestState

__all__ = ["RequestEvent", "RequestEventKind", "RequestHandle", "RequestState"]
