"""Receive on a ZeroMQ socket from an asyncio loop: every ready message per wake-up.

``zmq.asyncio`` costs a future, an event registration and several enum operations per
message: measured, most of the coordinator's time with a stage streaming to it. Here the
loop watches the socket's descriptor once; each wake-up reads every message already
there (up to a limit, then yields to the loop and goes on) with non-blocking receives on
a plain socket, and hands each to ``handle`` synchronously.
"""

from __future__ import annotations

import asyncio
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
        self._loop.add_reader(self._fd, self._ready)
        # The descriptor only signals new activity: read what arrived before we watched.
        self._loop.call_soon(self._ready)

    def _ready(self) -> None:
        if self._closed:
            return
        recv, handle = self._socket.recv, self._handle
        try:
            for _ in range(_PER_WAKEUP):
                try:
                    frame = recv(zmq.NOBLOCK)
                except zmq.Again:
                    return  # drained: the descriptor signals the next arrival
                handle(frame)
        except BaseException:
            # The descriptor will not signal messages already queued: come back for them.
            self._loop.call_soon(self._ready)
            raise
        self._loop.call_soon(self._ready)  # more may be waiting; let the loop breathe first

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
