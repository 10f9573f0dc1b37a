"""Receive one ZeroMQ message of the runtime: a typed header, then (a ``tcp`` payload) one
frame per tensor.

Tensors travel whole, one frame each. Cutting them into megabyte frames lets CurveZMQ's
sender encryption, the wire and the receiver's decryption overlap, but the receiver must then
join the frames (a copy of the tensor): measured through the transport's own path (send,
receive, join, decode; CURVE with ZAP) on a loaded 2-core machine, 64 MiB took a p50 of about
0.9 s in 1 MiB frames against 0.7 s whole, so tensors stay whole. ``benchmarks/tcp.py`` keeps
raw CURVE in 1 MiB frames as a column, to measure again on other hardware.
"""

from __future__ import annotations

import zmq
import zmq.asyncio


async def receive(socket: zmq.asyncio.Socket) -> tuple[bytes, list[memoryview]]:
    """One message off ``socket``: its header, copied (small, and cheaper so than a zero-copy
    frame), and the frames after it (a ``tcp`` payload's tensors), zero-copy."""
    while True:
        try:
            header = await socket.recv()
            break
        except zmq.Again:
            # libzmq reports a CURVE connection with a ZAP handler readable before the first
            # message after the handshake is whole when that message is large (a tensor that
            # opens the connection): pyzmq's asyncio socket then fails the recv with EAGAIN.
            # Nothing is lost; the next readiness brings the whole message.
            continue
    frames: list[memoryview] = []
    while socket.getsockopt(zmq.RCVMORE):  # the rest of a message is there once its first part is
        frames.append((await socket.recv(copy=False)).buffer)
    return header, frames
