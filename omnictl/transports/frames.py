"""How a ``tcp`` payload's tensor bytes are cut into ZeroMQ frames, and joined again.

Each tensor travels as frames of at most :data:`FRAME_BYTES`, views of its memory (no copy on
the way out). CurveZMQ encrypts and decrypts frame by frame, each into scratch buffers the
size of the frame: with megabyte frames the sender's encryption, the wire and the receiver's
decryption overlap, and the allocator reuses warm buffers, where one 64 MiB frame waits for
the whole message at every step and faults in fresh pages for each of its copies
(``benchmarks/tcp.py``: raw CURVE, 64 MiB in one frame against 1 MiB frames). The receiver
takes a tensor that came in one frame as a view of it, and joins a cut one into one buffer
(a single copy, cheaper than what cutting saves).
"""

from __future__ import annotations

import numpy as np
import zmq
import zmq.asyncio

from omnictl.messages import TensorLayout

FRAME_BYTES = 1 << 20  # see the module docstring; measured in benchmarks/tcp.py


def cut(views: list[memoryview], size: int = FRAME_BYTES) -> list[memoryview]:
    """The frames to send after the header: each tensor's bytes in slices of at most ``size``
    (an empty tensor is one empty frame)."""
    frames: list[memoryview] = []
    for view in views:
        flat = view.cast("B")  # its bytes (packing hands over contiguous views)
        if not len(flat):
            frames.append(flat)
        frames.extend(flat[i:i + size] for i in range(0, len(flat), size))
    return frames


def join(layout: tuple[TensorLayout, ...], frames: list[memoryview]) -> list[memoryview]:
    """One buffer per tensor of ``layout``, from the frames that followed the header, in order:
    the frame itself when the tensor came whole, else its frames joined. Raises ValueError when
    the frames do not add up to the layout (a peer that sent something else)."""
    buffers: list[memoryview] = []
    at = 0
    for entry in layout:
        parts: list[memoryview] = []
        got = 0
        while at < len(frames) and (got < entry.nbytes or not parts):
            parts.append(frames[at])
            got += len(frames[at])
            at += 1
            if entry.nbytes == 0:
                break
        if got != entry.nbytes:
            raise ValueError(f"tensor {entry.index} is {entry.nbytes} bytes but its frames hold {got}")
        buffers.append(parts[0] if len(parts) == 1 else _joined(parts, got))
    if at != len(frames):
        raise ValueError(f"the payload lists {len(layout)} tensor(s) but {len(frames) - at} more frame(s) came with it")
    return buffers


def _joined(parts: list[memoryview], nbytes: int) -> memoryview:
    out = np.empty(nbytes, dtype=np.uint8)
    offset = 0
    for part in parts:
        size = len(part)
        out[offset:offset + size] = np.frombuffer(part, dtype=np.uint8)
        offset += size
    return memoryview(out)


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
