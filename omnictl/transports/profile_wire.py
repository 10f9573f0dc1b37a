"""The profiler's sockets: where every process's events travel to the collector.

Three small wires, each owning its ZeroMQ context and sockets (the profiler opens none
itself, as every other socket belongs to ``omnictl/transports``):

- :class:`EventPush`: a recorder's PUSH to the collector, bounded by a high-water mark and
  never blocking (a full or torn-down socket answers False: the batch is the caller's to count).
- :class:`EventPull`: the collector's PULL, bound on ``ipc://`` and, with the launch's keys,
  on ``tcp://`` too (CurveZMQ, a ZAP authenticator admitting the launch's client key).
- :class:`ControlServer` / :class:`ControlClient`: the collector process's REP socket and
  the coordinator's REQ on it (snapshot, counts, stop).

Messages are single frames of bytes, as the profiler encodes them (msgpack).
"""

from __future__ import annotations

from typing import Sequence

import zmq
from zmq.auth.thread import ThreadAuthenticator

from omnictl.transports.curve import CurveKeys, start_authenticator

# Batches queued in ZeroMQ while the collector is slow or gone, before a send is refused.
EVENT_SEND_HWM = 64


class EventPush:
    """A recorder's PUSH socket to the collector at ``address``."""

    def __init__(self, address: str, curve: CurveKeys | None = None) -> None:
        """``curve``: the launch's keys, presented to a ``tcp://`` collector."""
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, EVENT_SEND_HWM)
        self._socket.setsockopt(zmq.LINGER, 0)
        if address.startswith("tcp://") and curve is not None:
            curve.connect_as_client(self._socket)
        self._socket.connect(address)

    def send(self, message: bytes) -> bool:
        """Queue ``message`` without blocking; False when it was not taken (the high-water
        mark is reached, or close() raced this send and the socket is gone)."""
        try:
            self._socket.send(message, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # zmq.Again (full) is one of these
            return False
        return True

    def close(self, linger_ms: int = 0) -> None:
        """Close, letting queued batches go out for up to ``linger_ms``."""
        self._socket.close(linger=max(0, linger_ms))
        self._context.term()


class _Readable:
    """A socket owned by one of these wires that :func:`wait_readable` can poll."""

    _socket: zmq.Socket[bytes]


def wait_readable(wires: Sequence[_Readable], timeout_ms: int) -> list[_Readable]:
    """Those of ``wires`` with a message waiting, after at most ``timeout_ms``."""
    poller = zmq.Poller()
    for wire in wires:
        poller.register(wire._socket, zmq.POLLIN)
    ready = dict(poller.poll(timeout_ms))
    return [wire for wire in wires if wire._socket in ready]


def _bound(kind: int, address: str, linger_ms: int) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
    """A context of its own and a ``kind`` socket on it bound at ``address``; OSError naming the
    address when it cannot be bound (the socket and context closed first)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, linger_ms)
    try:
        socket.bind(address)
    except zmq.ZMQError as error:
        socket.close()
        context.term()
        raise OSError(f"profiling collector cannot bind {address}: {error}") from error
    return context, socket


class EventPull(_Readable):
    """The collector's PULL socket, bound at ``address`` (and tcp, see ``tcp_address``)."""

    def __init__(self, address: str, tcp_host: str | None = None, curve: CurveKeys | None = None) -> None:
        """``tcp_host`` and ``curve``: also bind ``tcp://{tcp_host}:*`` for workers on other
        machines, CurveZMQ-authenticated with the launch's keys. Raises OSError naming the
        address that could not be bound."""
        self.tcp_address: str | None = None
        self._authenticator: ThreadAuthenticator | None = None
        self._context, self._socket = _bound(zmq.PULL, address, linger_ms=0)
        if tcp_host is not None and curve is not None:
            self._authenticator = start_authenticator(self._context, curve)
            curve.serve(self._socket)  # the ipc endpoint bound before keeps no security
            try:
                self._socket.bind(f"tcp://{tcp_host}:*")
            except zmq.ZMQError as error:
                self.close()
                raise OSError(f"profiling collector cannot bind tcp on {tcp_host}: {error}") from error
            self.tcp_address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv_nowait(self) -> memoryview | None:
        """The next message's bytes, or None when none is waiting."""
        try:
            frame = self._socket.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        return frame.buffer

    def poll(self, timeout_ms: int) -> bool:
        """Whether a message is waiting, after at most ``timeout_ms``."""
        return bool(self._socket.poll(timeout_ms, zmq.POLLIN))

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
        self._socket.close()
        self._context.term()


class ControlServer(_Readable):
    """The collector process's REP socket at ``address``."""

    def __init__(self, address: str) -> None:
        """Raises OSError naming the address that could not be bound."""
        self._context, self._socket = _bound(zmq.REP, address, linger_ms=1000)  # the stop's reply must still go out

    def recv(self) -> bytes:
        return self._socket.recv()

    def send(self, message: bytes) -> None:
        self._socket.send(message)

    def close(self) -> None:
        self._socket.close()
        self._context.term()


class ControlClient:
    """The coordinator's REQ socket on a collector process's :class:`ControlServer`."""

    def __init__(self, address: str) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.REQ)
        # A timed-out request must not wedge the socket, and its late reply must be ignored.
        self._socket.setsockopt(zmq.REQ_RELAXED, 1)
        self._socket.setsockopt(zmq.REQ_CORRELATE, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)

    def ask(self, message: bytes, timeout_s: float) -> bytes | None:
        """The reply to ``message``, or None when none came within ``timeout_s``."""
        self._socket.send(message)
        if not self._socket.poll(int(timeout_s * 1000)):
            return None
        return self._socket.recv()

    def close(self) -> None:
        self._socket.close()
        self._context.term()
