"""ZeroMQ from an asyncio loop without a future per message: receive every ready message
per wake-up (:class:`Drain`), send several messages per send (:class:`Outgoing`).

``zmq.asyncio`` costs a future, an event registration and several enum operations per
message: measured, most of the coordinator's time with a stage streaming to it. Here the
loop watches the socket's descriptor once; each wake-up reads every message already
there (up to a limit, then yields to the loop and goes on) with non-blocking receives on
a plain socket, and hands each to ``handle`` synchronously.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

import zmq

_PER_WAKEUP = 256  # messages read before other callbacks get a turn


class Drain:
    """Calls ``handle(frame)`` for every message arriving on ``socket`` (a plain, not an
    asyncio, ZeroMQ socket that only this drain reads). Build on the loop; ``close``
    stops watching (the socket is the caller's to close)."""

    def __init__(self, socket: zmq.Socket, handle: Callable[[bytes], None]) -> None:
        self._socket = socket
        self._handle = handle
        self._loop = asyncio.get_running_loop()
        self._fd = socket.getsockopt(zmq.FD)
        self._closed = False
        self._backlog: collections.deque[bytes] = collections.deque()  # frames of a batch not yet handled
        self._loop.add_reader(self._fd, self._ready)
        # The descriptor only signals new activity: read what arrived before we watched.
        self._loop.call_soon(self._ready)

    def _ready(self) -> None:
        if self._closed:
            return
        recv_multipart, backlog = self._socket.recv_multipart, self._backlog
        try:
            for _ in range(_PER_WAKEUP):
                if not backlog:
                    try:
                        backlog.extend(recv_multipart(zmq.NOBLOCK))  # a batch from Outgoing, or one message
                    except zmq.Again:
                        return  # drained: the descriptor signals the next arrival
                while backlog:
                    self._handle(backlog.popleft())
        except BaseException:
            # The descriptor will not signal what is already queued: come back for it.
            self._loop.call_soon(self._ready)
            raise
        self._loop.call_soon(self._ready)  # more may be waiting; let the loop breathe first

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)


class Outgoing:
    """Sends to ZeroMQ sockets, batched per loop iteration: every message queued for one
    socket while the loop runs its current callbacks leaves in one multipart send (one
    I/O-thread wake-up instead of one per message). A :class:`Drain` receives each frame
    as a message of its own. Never blocks: the sockets have no high-water mark."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queued: dict[zmq.Socket, list[bytes]] = {}

    def send(self, socket: zmq.Socket, frame: bytes) -> None:
        queued = self._queued.get(socket)
        if queued is not None:
            queued.append(frame)
            return
        if not self._queued:
            self._loop.call_soon(self.flush)
        self._queued[socket] = [frame]

    def flush(self) -> None:
        """Send everything queued now (also before closing the sockets)."""
        queued, self._queued = self._queued, {}
        for socket, frames in queued.items():
            if len(frames) == 1:
                socket.send(frames[0])
            else:
                socket.send_multipart(frames)
