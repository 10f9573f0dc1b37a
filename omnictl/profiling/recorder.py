"""The per-process event recorder: a bounded buffer drained by a shipping thread.

``record`` is on the data path of every stage, so it only appends to a deque (atomic
under the GIL, so no lock on the hot path); when the buffer is full it drops the event
and counts it. A daemon thread ships the buffer every ``flush_interval`` seconds as one
msgpack-encoded ``list[Event]`` over a PUSH socket of its own (an
:class:`omnictl.transports.profile_wire.EventPush`). The socket never blocks
either: with the collector gone the high-water mark fills up and further batches are
dropped (and counted). Drops are reported to the collector with the next batch that
gets through, as a ``dropped`` event, so the dashboard can show them.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import msgspec

from omnictl.profiling.events import Event, EventKind, MetaValue
from omnictl.transports.curve import CurveKeys
from omnictl.transports.profile_wire import EventPush


class Recorder:
    """Implements :class:`~omnictl.profiling.events.Profiler` for one process."""

    def __init__(
        self,
        process: str,
        address: str,
        capacity: int = 65536,
        flush_interval: float = 0.05,
        curve: CurveKeys | None = None,  # the launch's keys, for a tcp:// collector
    ) -> None:
        if capacity < 1:
            raise ValueError(f"Recorder capacity must be at least 1, got {capacity}")
        self.process = process
        self.address = address
        self.capacity = capacity
        self.flush_interval = flush_interval
        self.dropped = 0  # events lost: buffer full, socket full, or unencodable
        self.shipped = 0  # events handed to ZeroMQ
        self._reported_drops = 0  # drops already announced to the collector
        self._buffer: deque[Event] = deque()
        self._drop_lock = threading.Lock()  # only taken when dropping: the rare path
        self._send_lock = threading.Lock()  # the shipping thread and close() both ship
        self._closed = threading.Event()
        self._encoder = msgspec.msgpack.Encoder()
        self._wire = EventPush(address, curve)
        self._thread = threading.Thread(target=self._ship_loop, name=f"omnictl-recorder-{process}", daemon=True)
        self._thread.start()

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: MetaValue) -> None:
        """Buffer one event; never blocks on IO and never raises for a full buffer."""
        buffer = self._buffer
        # Racing threads may overshoot the capacity by one event each: still bounded.
        if len(buffer) < self.capacity:
            buffer.append(Event(kind, request_id, stage, self.process, time.time_ns(), meta))
        else:
            self._count_drops(1)

    def flush(self) -> None:
        """Ship whatever is buffered now (the shipping thread does this periodically)."""
        with self._send_lock:
            take = self._buffer.popleft
            batch = [take() for _ in range(len(self._buffer))]
            drops = self.dropped - self._reported_drops
            if drops:
                # Tell the collector about losses so the dashboard can show them.
                batch.append(Event(EventKind.DROPPED, "", None, self.process, time.time_ns(), {"count": drops}))
            if batch:
                self._send(batch, drops)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the shipping thread, flush what is left, and wait up to ``timeout`` for delivery."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout)
        self.flush()
        self._wire.close(linger_ms=int(timeout * 1000))

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ship_loop(self) -> None:
        while not self._closed.wait(self.flush_interval):
            self.flush()

    def _send(self, batch: list[Event], announced_drops: int) -> None:
        try:
            message = self._encoder.encode(batch)
        except (TypeError, ValueError, OverflowError):
            # Some event's meta holds something msgpack cannot carry: keep the others.
            kept = [event for event in batch if _encodable(self._encoder, event)]
            self._count_drops(len(batch) - len(kept))
            batch = kept
            message = self._encoder.encode(batch)
        if not self._wire.send(message):
            # The high-water mark is reached (the collector is slow or gone), or close()
            # raced a flush and the socket is gone: the batch is lost.
            self._count_drops(sum(1 for e in batch if e.kind is not EventKind.DROPPED))
            return
        self._reported_drops += announced_drops
        self.shipped += len(batch)

    def _count_drops(self, count: int) -> None:
        with self._drop_lock:
            self.dropped += count


def _encodable(encoder: msgspec.msgpack.Encoder, event: Event) -> bool:
    try:
        encoder.encode(event)
    except (TypeError, ValueError, OverflowError):
        return False
    return True
