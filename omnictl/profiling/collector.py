"""The collector: one PULL socket that every process's Recorder ships batches to.

A daemon thread receives the batches, appends them to the run's trace store and feeds
the live aggregator. It runs in the coordinator's process, off the event loop.
"""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import zmq

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.events import Event
from omnictl.profiling.recorder import Recorder
from omnictl.profiling.store import TraceStore

_POLL_MS = 100  # how often the receiving thread checks whether it should stop


class Collector:
    def __init__(
        self,
        run_dir: Path,
        address: str,
        store: TraceStore | None = None,
        aggregator: Aggregator | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.address = address
        self.store = store if store is not None else TraceStore(self.run_dir)
        self.aggregator = aggregator if aggregator is not None else Aggregator()
        self.received = 0  # events received so far
        self.malformed = 0  # messages that were not a msgpack list[Event]
        self._decoder = msgspec.msgpack.Decoder(list[Event])
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._stopping = threading.Event()
        self._drain_timeout = 0.2
        self._thread: threading.Thread | None = None
        self._received_changed = threading.Condition()

    def start(self) -> "Collector":
        """Bind the PULL socket and start receiving; returns self."""
        if self._thread is not None:
            raise RuntimeError("collector already started")
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as error:
            self._socket.close()
            self._context.term()
            raise OSError(f"profiling collector cannot bind {self.address}: {error}") from error
        self._thread = threading.Thread(target=self._receive_loop, name="omnictl-collector", daemon=True)
        self._thread.start()
        return self

    def local_recorder(self, process: str = "coordinator") -> Recorder:
        """A recorder for this process that ships to this collector."""
        return Recorder(process, self.address)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` events were received or ``timeout`` passes."""
        with self._received_changed:
            return self._received_changed.wait_for(lambda: self.received >= count, timeout)

    def close(self, drain_timeout: float = 0.2) -> None:
        """Receive what is still in flight for up to ``drain_timeout``, then stop."""
        if self._thread is None:
            return
        self._drain_timeout = drain_timeout
        self._stopping.set()
        self._thread.join()
        self._thread = None
        assert self._socket is not None and self._context is not None
        self._socket.close()
        self._context.term()
        self.store.close()

    def __enter__(self) -> "Collector":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _receive_loop(self) -> None:
        assert self._socket is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stopping.is_set():
            if poller.poll(_POLL_MS):
                self._receive_ready()
        # Stopping: take whatever recorders flushed on their way out.
        while poller.poll(int(self._drain_timeout * 1000)):
            self._receive_ready()

    def _receive_ready(self) -> None:
        assert self._socket is not None
        while True:
            try:
                message = self._socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                events = self._decoder.decode(message.buffer)
            except msgspec.DecodeError:
                self.malformed += 1
                continue
            self.store.append(events)
            self.aggregator.add(events)
            with self._received_changed:
                self.received += len(events)
                self._received_changed.notify_all()
