"""The receiving end of profiling: a PULL socket whose batches go to the store and aggregator.

Shared by both ways of running a collector (a thread of the coordinator's process, or a
process of its own); whoever owns it polls ``socket`` and calls ``take_ready``.
"""

from __future__ import annotations

from typing import Callable

import msgspec
import zmq
from zmq.auth.thread import ThreadAuthenticator

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.events import Event
from omnictl.profiling.store import TraceStore
from omnictl.transports.curve import CurveKeys, start_authenticator

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
        self.tcp_address: str | None = None
        self._authenticator: ThreadAuthenticator | None = None
        self.store = store
        self.aggregator = aggregator
        self.on_events = on_events  # a third consumer of every batch (the OTLP export), if any
        self.received = 0  # events received so far
        self.malformed = 0  # messages that were not a msgpack list[Event]
        self._decoder = msgspec.msgpack.Decoder(list[Event])
        self._context = zmq.Context()
        self.socket = self._context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        try:
            self.socket.bind(address)
        except zmq.ZMQError as error:
            self.socket.close()
            self._context.term()
            raise OSError(f"profiling collector cannot bind {address}: {error}") from error
        if tcp_host is not None and curve is not None:
            self._authenticator = start_authenticator(self._context, curve)
            curve.serve(self.socket)  # the ipc endpoint bound before keeps no security
            try:
                self.socket.bind(f"tcp://{tcp_host}:*")
            except zmq.ZMQError as error:
                self.close()
                raise OSError(f"profiling collector cannot bind tcp on {tcp_host}: {error}") from error
            self.tcp_address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def take_ready(self) -> int:
        """Store and aggregate the batches waiting now; returns how many events that was."""
        taken = 0
        for _ in range(_MAX_BATCHES_PER_CALL):
            try:
                message = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                events = self._decoder.decode(message.buffer)
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
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while poller.poll(int(timeout_s * 1000)):
            self.take_ready()

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
        self.socket.close()
        self._context.term()
        self.store.close()
