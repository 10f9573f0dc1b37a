"""What a component needs to record profiling events: the event kinds and the recorder's
interface (:class:`Profiler`, and :class:`NullProfiler` when profiling is off).

The recorder, the collector and the trace behind them are the runtime's (``omnictl.profiling``);
code outside it, such as the HTTP server, records through these names.
"""

from __future__ import annotations

from omnictl.profiling.events import Event, EventKind, MetaValue, NullProfiler, Profiler

__all__ = ["Event", "EventKind", "MetaValue", "NullProfiler", "Profiler"]
