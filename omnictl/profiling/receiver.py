"""The receiving end of profiling: a PULL socket whose batches go to the store and aggregator.

Shared by both ways of running a collector (a thread of the coordinator's process, or a
process of its own); whoever owns it polls ``wire`` and calls ``take_ready``. The socket
itself is :class:`omnictl.transports.profile_wire.EventPull`.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.events import Event
from omnictl.profiling.store import TraceStore
from omnictl.transports.curve import CurveKeys
from omnictl.transports.profile_wire import EventPull

# Batches taken per call, so a flood of events never starves whoever else the owner serves.
_MAX_BATCHES_PER_CALL = 64


class Receiver:
    def __init__(
        self,
        address: str,
        store: TraceStore,
        aggregator: Aggregator,
        on_events: Callable[[list[Event]], None] | None = None,
        tcp_host: str | None = None,
        curve: CurveKeys | None = None,
    ) -> None:
        """``on_events``: also handed every batch of events (the OpenTelemetry export).
        ``tcp_host`` and ``curve``: also take events over tcp (workers on other machines),
        CurveZMQ-authenticated with the launch's keys; ``tcp_address`` is where."""
        self.address = address
        self.store = store
        self.aggregator = aggregator
        self.on_events = on_events  # a third consumer of every batch (the OTLP export), if any
        self.received = 0  # events received so far
        self.malformed = 0  # messages that were not a msgpack list[Event]
        self._decoder = msgspec.msgpack.Decoder(list[Event])
        self.wire = EventPull(address, tcp_host, curve)
        self.tcp_address = self.wire.tcp_address

    def take_ready(self) -> int:
        """Store and aggregate the batches waiting now; returns how many events that was."""
        taken = 0
        for _ in range(_MAX_BATCHES_PER_CALL):
            message = self.wire.recv_nowait()
            if message is None:
                break
            try:
                events = self._decoder.decode(message)
            except msgspec.DecodeError:
                self.malformed += 1
                continue
            self.store.append(events, flush=False)
            self.aggregator.add(events)
            if self.on_events is not None:
                self.on_events(events)
            taken += len(events)
        if taken:
            self.store.flush()  # once per call: readable on disk without a write per batch
        self.received += taken
        return taken

    def drain(self, timeout_s: float) -> None:
        """Take what recorders flushed on their way out, until nothing came for ``timeout_s``."""
        while self.wire.poll(int(timeout_s * 1000)):
            self.take_ready()

    def close(self) -> None:
        self.wire.close()
        self.store.close()
