"""ZeroMQ from an asyncio loop without a future per message: receive every ready message
per wake-up (:class:`Drain`), send several messages per send (:class:`Outgoing`).

``zmq.asyncio`` costs a future, an event registration and several enum operations per
message: measured, most of the coordinator's time with a stage streaming to it. Here the
loop watches the socket's descriptor once; each wake-up reads every message already
there (up to a limit, then yields to the loop and goes on) with non-blocking receives on
a plain socket, and hands each to ``handle`` synchronously.

The wire: one ZeroMQ multipart message carries one or more runtime messages, each a typed
header frame followed by as many frames as its payload has tensors sent as frames (a
``tcp`` payload: :func:`tensor_frames`; zero for everything else). The receiver decodes a
header before it reads the next part, so it always knows where the next header starts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

import msgspec
import zmq

from omnictl.messages import DataReady, StreamChunk, Submit, TerminalOutput

_PER_WAKEUP = 256  # multipart messages read before other callbacks get a turn
_WITH_PAYLOAD = (Submit, DataReady, StreamChunk, TerminalOutput)

log = logging.getLogger(__name__)


def tensor_frames(message: Any) -> int:
    """How many frames after ``message``'s header carry its tensors."""
    if isinstance(message, _WITH_PAYLOAD) and message.payload.frames:
        return len(message.payload.layout)
    return 0


class Drain:
    """Calls ``handle(message, frames)`` for every runtime message arriving on ``socket`` (a
    plain, not an asyncio, ZeroMQ socket that only this drain reads), ``decode`` turning its
    header into ``message``; ``frames`` are its tensor frames, zero-copy. Build on the loop;
    ``close`` stops watching (the socket is the caller's to close)."""

    def __init__(
        self,
        socket: zmq.Socket,
        decode: Callable[[bytes], Any],
        handle: Callable[[Any, list[memoryview]], None],
        name: str,
    ) -> None:
        self._socket = socket
        self._decode = decode
        self._handle = handle
        self._name = name  # for the log: whose socket
        self._loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))  # an int on POSIX
        self._closed = False
        self._loop.add_reader(self._fd, self._ready)
        # The descriptor only signals new activity: read what arrived before we watched.
        self._loop.call_soon(self._ready)

    def _ready(self) -> None:
        if self._closed:
            return
        socket = self._socket
        try:
            for _ in range(_PER_WAKEUP):
                # Asking first is cheaper than the exception an empty socket raises, and
                # reading the events re-arms the descriptor (ZeroMQ's is edge-triggered).
                if not int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return  # drained: the descriptor signals the next arrival
                try:
                    # Copied: a header is small, and bytes are cheaper than a zero-copy frame.
                    header = socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    # A CURVE connection can report a large first message readable before it
                    # is whole: the descriptor signals again once it is.
                    return
                self._read(header)
        except BaseException:
            # The descriptor will not signal what is already queued: come back for it.
            self._loop.call_soon(self._ready)
            raise
        self._loop.call_soon(self._ready)  # more may be waiting; let the loop breathe first

    def _read(self, header: bytes) -> None:
        """The runtime messages of one multipart message, from its first header on. A
        message's frames are read before it is handled, so a handler that raises leaves
        the next header next."""
        socket = self._socket
        while True:
            try:
                message = self._decode(header)
            except msgspec.DecodeError as exc:
                # Where the next header starts is unknown: drop the rest of this multipart.
                dropped = 0
                while socket.getsockopt(zmq.RCVMORE):
                    socket.recv(copy=False)
                    dropped += 1
                log.warning(
                    "%s: undecodable message (a peer speaking another protocol version?), "
                    "dropped with the %d part(s) after it: %s",
                    self._name,
                    dropped,
                    exc,
                )
                return
            frames = [socket.recv(copy=False).buffer for _ in range(tensor_frames(message))]
            more = socket.getsockopt(zmq.RCVMORE)
            self._handle(message, frames)
            if not more:
                return
            del message, frames  # not kept alive (views of tensors) while the next is handled
            header = socket.recv()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)


class Outgoing:
    """Sends to ZeroMQ sockets, batched per loop iteration: every message queued for one
    socket while the loop runs its current callbacks leaves in one multipart send (one
    I/O-thread wake-up instead of one per message). Never blocks: the sockets have no
    high-water mark. Every send to a socket must go through here, or order is lost."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queued: dict[zmq.Socket, list[Any]] = {}

    def send(self, socket: zmq.Socket, header: bytes, frames: Sequence[memoryview] = ()) -> None:
        """Queue one runtime message: its header, then its tensor frames (sent zero-copy)."""
        queued = self._queued.get(socket)
        if queued is None:
            if not self._queued:
                self._loop.call_soon(self.flush)
            queued = self._queued[socket] = []
        queued.append(header)
        if frames:
            queued.extend(frames)

    def discard(self, socket: zmq.Socket) -> None:
        """Forget what is queued for ``socket`` (it is about to be closed: its peer died)."""
        self._queued.pop(socket, None)

    def flush(self) -> None:
        """Send everything queued now (also before closing the sockets)."""
        queued, self._queued = self._queued, {}
        for socket, parts in queued.items():
            if len(parts) == 1:
                socket.send(parts[0])
            else:
                # Below pyzmq's copy threshold a part is copied anyway; tensors are not.
                socket.send_multipart(parts, copy=False)
