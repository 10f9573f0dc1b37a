"""The collector: one PULL socket that every process's Recorder ships batches to.

It appends the batches to the run's trace store and feeds the live aggregator. By default
that work happens in a process of its own (see :mod:`collector_process`), so it never
holds the coordinator's GIL; ``separate_process=False`` runs it in a daemon thread of
this process instead (cheaper to start: tests, small tools). Either way ``aggregator``
answers ``snapshot()`` and ``store`` reads the trace.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from omnictl.profiling.aggregate import Aggregator
from omnictl.profiling.collector_process import (
    CollectorConfig,
    CollectorProcess,
    ControlRequest,
    RemoteAggregator,
)
from omnictl.profiling.receiver import Receiver
from omnictl.profiling.recorder import Recorder
from omnictl.profiling.sinks import EventSink, SinkSpec, open_sink
from omnictl.profiling.stats import SnapshotSource
from omnictl.profiling.store import TraceStore
from omnictl.transports.curve import CurveKeys

_POLL_MS = 100  # how often the receiving thread checks whether it should stop
_COUNTS_POLL_S = 0.01


class Collector:
    def __init__(
        self,
        run_dir: Path,
        address: str,
        separate_process: bool = True,
        window_s: float = 30.0,
        segment_bytes: int = 16 * 1024 * 1024,
        max_segments: int = 8,
        control_address: str | None = None,
        sink: SinkSpec | None = None,
        tcp_host: str | None = None,
        curve: CurveKeys | None = None,
    ) -> None:
        """``tcp_host`` and ``curve``: also take events over tcp from workers on other
        machines, CurveZMQ-authenticated (``tcp_address`` once started). ``sink``: where
        finished requests' events go too (the OpenTelemetry export: see omnictl.telemetry)."""
        self.run_dir = Path(run_dir)
        self.tcp_host = tcp_host
        self.curve = curve
        self.tcp_address: str | None = None
        self.address = address
        self.separate_process = separate_process
        self.window_s = window_s
        self._segment_bytes = segment_bytes
        self._max_segments = max_segments
        if control_address is None and separate_process:
            if not address.startswith("ipc://"):
                raise ValueError(
                    f"give a control_address for a collector process on {address!r} (derived only for ipc://)"
                )
            control_address = f"{address}.control"
        self.control_address = control_address
        self.sink = sink
        self.store = TraceStore(self.run_dir, segment_bytes, max_segments)  # for reading the trace
        self._aggregator = Aggregator(window_s)  # fed here in thread mode
        self.aggregator: SnapshotSource = self._aggregator
        self._process: CollectorProcess | None = None
        self._sink: EventSink | None = None  # thread mode with a sink
        self._receiver: Receiver | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._drain_s = 0.2
        self._final_counts = (0, 0)  # what the collector process reported when it stopped

    def start(self) -> Collector:
        """Bind the PULL socket and start receiving; returns self."""
        if self._process is not None or self._thread is not None:
            raise RuntimeError("collector already started")
        if self.separate_process:
            assert self.control_address is not None
            config = CollectorConfig(
                str(self.run_dir),
                self.address,
                self.control_address,
                self.window_s,
                self._segment_bytes,
                self._max_segments,
                os.getpid(),
                self.sink,
                self.tcp_host,
                self.curve,
            )
            self._process = CollectorProcess(config)
            self.tcp_address = self._process.tcp_address
            self.aggregator = RemoteAggregator(self._process, self.window_s)
            return self
        self._sink = open_sink(self.sink)
        self._receiver = Receiver(
            self.address,
            self.store,
            self._aggregator,
            self._sink.add if self._sink is not None else None,
            self.tcp_host,
            self.curve,
        )
        self.tcp_address = self._receiver.tcp_address
        self._thread = threading.Thread(target=self._receive_loop, name="omnictl-collector", daemon=True)
        self._thread.start()
        return self

    @property
    def pid(self) -> int:
        """The process doing the collecting (this one in thread mode)."""
        return self._process.pid if self._process is not None else os.getpid()

    @property
    def received(self) -> int:
        """Events received so far."""
        return self._counts()[0]

    @property
    def malformed(self) -> int:
        """Messages that were not a msgpack ``list[Event]``."""
        return self._counts()[1]

    def local_recorder(self, process: str = "coordinator") -> Recorder:
        """A recorder for this process that ships to this collector."""
        return Recorder(process, self.address)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Poll until at least ``count`` events were received, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        pause = threading.Event()  # never set: a plain interruptible wait between polls
        while self.received < count:
            if time.monotonic() >= deadline:
                return False
            pause.wait(_COUNTS_POLL_S)
        return True

    def close(self, drain_timeout: float = 0.2) -> None:
        """Receive what is still in flight until ``drain_timeout`` passes quietly, then stop."""
        if self._process is not None:
            reply = self._process.stop(drain_timeout)
            if reply is not None:
                self._final_counts = (reply.counts.received, reply.counts.malformed)
                if reply.snapshot is not None and isinstance(self.aggregator, RemoteAggregator):
                    self.aggregator.keep(reply.snapshot)  # figures stay readable after close
            self._process = None
        if self._thread is not None:
            self._drain_s = drain_timeout
            self._stopping.set()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _counts(self) -> tuple[int, int]:
        if self._receiver is not None:
            return self._receiver.received, self._receiver.malformed
        if self._process is None:
            return self._final_counts
        reply = self._process.ask(ControlRequest("counts"), timeout_s=5.0)
        if reply is None:
            raise RuntimeError(f"profiling collector (pid {self._process.pid}) is not answering")
        return reply.counts.received, reply.counts.malformed

    def _receive_loop(self) -> None:
        receiver = self._receiver
        assert receiver is not None
        while not self._stopping.is_set():
            if receiver.wire.poll(_POLL_MS):
                receiver.take_ready()
            if self._sink is not None:
                self._sink.tick()
        receiver.drain(self._drain_s)
        receiver.close()
        if self._sink is not None:
            self._sink.close()
