"""Where finished requests' events go besides the trace store: sinks plugged into the collector.

The collector knows no sink by name. A :class:`SinkSpec` says which callable builds the sink
(``"package.module:function"``, called with the spec's ``options`` in the collector's own
process, where the sink runs) — the OpenTelemetry export is one (:mod:`omnictl.telemetry`
makes its spec), so profiling never imports telemetry.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterable, Protocol

import msgspec

from omnictl.profiling.events import Event


class EventSink(Protocol):
    def add(self, events: Iterable[Event]) -> None:
        """Events as they arrive (every request's, in arrival order)."""
        ...

    def tick(self) -> None:
        """Called about once a second: flush what is due."""
        ...

    def close(self) -> None:
        """The collector stops: send what is left."""
        ...


class SinkSpec(msgspec.Struct, frozen=True):
    """How to build a sink in the collector's process (it travels there as JSON)."""

    factory: str  # "package.module:function", called as function(options) -> EventSink
    options: dict[str, Any] = {}
    logs: bool = False  # the sink logs (e.g. an unreachable endpoint): the collector logs as the server does


def open_sink(spec: SinkSpec | None) -> EventSink | None:
    if spec is None:
        return None
    module, _, name = spec.factory.partition(":")
    if not module or not name:
        raise ValueError(f"a sink factory is 'package.module:function', not {spec.factory!r}")
    build = getattr(importlib.import_module(module), name)
    sink: EventSink = build(spec.options)
    return sink
