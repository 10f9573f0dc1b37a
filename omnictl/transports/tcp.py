"""``tcp`` edges (processes on different nodes): a typed header frame, then one ZeroMQ frame
per tensor, sent and received without copies.

The header is the usual message (``DataReady``, ``StreamChunk``, ``TerminalOutput``, ``Submit``)
whose payload holds the msgpack skeleton and the tensor layout; the tensors' bytes are not
in it but follow as frames, handed to ZeroMQ zero-copy (``send_multipart(copy=False)``) and
rebuilt on arrival as views of the received frames. GPU tensors are copied to host memory on
the way and arrive on the CPU; the receiving stage moves them to its own device
(device-to-device transfer, NCCL or NIXL, is future work).
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnictl.messages import EncodedPayload
from omnictl.transports.codec import PayloadCodec
from omnictl.transports.packing import pack


class TcpCodec(PayloadCodec):
    """Never touches the slot pool: nothing is shared between the two machines but the socket."""

    def encode_frames(self, data: Any) -> tuple[EncodedPayload, list[memoryview]]:
        packed = pack(data, allow_pickle=self.allow_pickle)
        # each tensor is a frame of its own: its bytes start at 0 there
        layout = tuple(msgspec.structs.replace(entry, offset=0) for entry in packed.layout)
        return EncodedPayload(packed.skeleton, layout, frames=bool(layout)), packed.views

    def encode(self, data: Any) -> EncodedPayload:
        raise TypeError("tcp payloads travel as frames: use encode_frames")
