"""The collector's own process, and the coordinator-side handle that talks to it.

Decoding, storing and aggregating every event costs CPU; in the coordinator's process it
would also hold the coordinator's GIL, stalling the one component every request goes
through. So by default the collector runs here, in a child process started with
``python -m omnictl.profiling.collector_process``: its config arrives as one JSON line on
stdin, it answers ``ready`` (or ``error: ...``) on stdout, then serves control requests
(snapshot, counts, stop) on a REP socket while it receives events. It exits when told to,
or when its parent is gone.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import msgspec

from omnictl.profiling.aggregate import Aggregator, ProfileSnapshot
from omnictl.profiling.receiver import Receiver
from omnictl.profiling.sinks import SinkSpec, open_sink
from omnictl.profiling.store import TraceStore
from omnictl.transports.curve import CurveKeys
from omnictl.transports.profile_wire import ControlClient, ControlServer, wait_readable

_PARENT_CHECK_MS = 200
_START_TIMEOUT_S = 60.0  # a cold interpreter on a busy machine takes seconds
_STOP_TIMEOUT_S = 5.0


class CollectorConfig(msgspec.Struct, frozen=True):
    run_dir: str
    address: str
    control_address: str
    window_s: float
    segment_bytes: int
    max_segments: int
    parent_pid: int
    sink: SinkSpec | None = None  # e.g. the OpenTelemetry export (omnictl.telemetry)
    tcp_host: str | None = None  # also take events over tcp, CurveZMQ with these keys
    curve: CurveKeys | None = None


class ControlRequest(msgspec.Struct, frozen=True):
    """``op``: snapshot (aggregates as of ``now``), counts, or stop (drain, reply with the
    final counts and snapshot, then exit)."""

    op: str
    now: int | None = None
    drain_s: float = 0.2


class Counts(msgspec.Struct, frozen=True):
    received: int
    malformed: int


class ControlReply(msgspec.Struct, frozen=True):
    counts: Counts
    snapshot: ProfileSnapshot | None = None


def serve(config: CollectorConfig) -> None:
    """Receive events and answer control requests until told to stop or orphaned."""
    aggregator = Aggregator(window_s=config.window_s)
    store = TraceStore(Path(config.run_dir), config.segment_bytes, config.max_segments)
    sink = open_sink(config.sink)
    receiver = Receiver(
        config.address, store, aggregator, sink.add if sink is not None else None, config.tcp_host, config.curve
    )
    try:
        control = ControlServer(config.control_address)
    except OSError:
        receiver.close()
        raise
    print(f"ready {receiver.tcp_address or ''}".strip(), flush=True)  # and where it takes tcp
    decoder = msgspec.msgpack.Decoder(ControlRequest)
    encoder = msgspec.msgpack.Encoder()
    try:
        while os.getppid() == config.parent_pid:
            ready = wait_readable([receiver.wire, control], _PARENT_CHECK_MS)
            if receiver.wire in ready:
                receiver.take_ready()
            if sink is not None:
                sink.tick()
            if control in ready:
                request = decoder.decode(control.recv())
                if request.op == "stop":
                    receiver.drain(request.drain_s)
                counts = Counts(receiver.received, receiver.malformed)
                snapshot = aggregator.snapshot(request.now) if request.op in ("snapshot", "stop") else None
                control.send(encoder.encode(ControlReply(counts, snapshot)))
                if request.op == "stop":
                    return
    finally:
        receiver.close()
        control.close()
        if sink is not None:
            sink.close()  # after the reply: flushing to a slow endpoint must not delay the stop's answer


class CollectorProcess:
    """The coordinator's handle on the collector process: start, ask, stop."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self._lock = threading.Lock()  # one request at a time on the REQ socket
        self._closed = False  # stop() closed the REQ socket: every later ask is unanswered
        self._process = subprocess.Popen(
            [sys.executable, "-m", "omnictl.profiling.collector_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(msgspec.json.encode(config) + b"\n")
        self._process.stdin.close()
        line = _read_line(self._process.stdout, _START_TIMEOUT_S)
        self.tcp_address: str | None = None
        if line is not None and line.startswith("ready "):
            self.tcp_address = line.removeprefix("ready ")
        elif line != "ready":
            self._process.kill()
            self._process.wait()
            if line is None:
                detail = f"no answer within {_START_TIMEOUT_S:g} s"
            elif line:
                detail = line.removeprefix("error: ")
            else:  # its stdout closed: it exited before it could say why (see its stderr)
                detail = f"the collector process exited with code {self._process.returncode}"
            raise OSError(f"profiling collector did not start: {detail}")
        self._control = ControlClient(config.control_address)
        self._decoder = msgspec.msgpack.Decoder(ControlReply)

    @property
    def pid(self) -> int:
        return self._process.pid

    def ask(self, request: ControlRequest, timeout_s: float) -> ControlReply | None:
        """The collector's reply, or None when it did not answer within ``timeout_s``."""
        with self._lock:
            if self._closed or self._process.poll() is not None:
                return None
            reply = self._control.ask(msgspec.msgpack.encode(request), timeout_s)
            return None if reply is None else self._decoder.decode(reply)

    def stop(self, drain_s: float) -> ControlReply | None:
        reply = self.ask(ControlRequest("stop", drain_s=drain_s), timeout_s=drain_s + _STOP_TIMEOUT_S)
        try:
            self._process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        # Under the lock: the dashboard's status thread may be asking for a snapshot right
        # now, and a socket closed under its poll fails it ("Socket operation on non-socket").
        with self._lock:
            self._closed = True
            self._control.close()
        if self._process.stdout is not None:
            self._process.stdout.close()
        return reply


class RemoteAggregator:
    """``snapshot()`` from the collector process; the last good one when it does not answer."""

    def __init__(self, process: CollectorProcess, window_s: float, timeout_s: float = 0.5) -> None:
        self.window_s = window_s
        self._process = process
        self._timeout_s = timeout_s
        self._last: ProfileSnapshot = Aggregator(window_s).snapshot()

    def snapshot(self, now: int | None = None) -> ProfileSnapshot:
        reply = self._process.ask(ControlRequest("snapshot", now=now), self._timeout_s)
        if reply is not None and reply.snapshot is not None:
            self._last = reply.snapshot
        return self._last

    def keep(self, snapshot: ProfileSnapshot) -> None:
        """Hold ``snapshot`` as the latest (the collector's final one, once it stopped)."""
        self._last = snapshot


def _read_line(stream: IO[bytes], timeout_s: float) -> str | None:
    """One line from a child's stdout, or None if none comes within ``timeout_s``."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        return None
    return stream.readline().decode(errors="replace").strip()


def main() -> None:
    # Ctrl-C reaches the whole process group; stopping is the coordinator's call, so that
    # the last batches are drained and stored first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = msgspec.json.decode(sys.stdin.buffer.readline(), type=CollectorConfig)
    if config.sink is not None and config.sink.logs:
        _log_like_the_server()
    try:
        serve(config)
    except OSError as error:
        print(f"error: {error}", flush=True)
        sys.exit(1)


def _log_like_the_server() -> None:
    """The OTLP export logs (an unreachable endpoint): in the server's level and format."""
    from omnictl.logs import FORMATS, configure

    fmt = os.environ.get("OMNICTL_LOG_FORMAT", "text")
    configure(
        os.environ.get("OMNICTL_LOG_LEVEL", "INFO"),
        fmt if fmt in FORMATS else "text",  # type: ignore[arg-type]  # narrowed to one of FORMATS by the test beside it
        process_name="collector",
    )


if __name__ == "__main__":
    main()
