"""A transport plug-in written the way docs/adding-a-transport.md says, touching no core file.

``copy``: between two CPU processes on the coordinator's machine, every payload is copied
into the message itself, however large, instead of lent in a shared-memory slot. Selected
before ``shm`` (rank 15). Its payloads are ordinary inline payloads, so the receiving side
decodes them as it decodes any other.
"""

from __future__ import annotations

from typing import Any

from omnictl.messages import EncodedPayload
from omnictl.transports.kinds import Transport
from omnictl.transports.codec import PayloadCodec
from omnictl.transports.packing import pack
from omnictl.transports.registry import Placement, TransportPlugin

COPY = Transport("copy")


class CopyCodec(PayloadCodec):
    def encode(self, data: Any) -> EncodedPayload:
        packed = pack(data, allow_pickle=self.allow_pickle)
        return EncodedPayload(packed.skeleton, packed.layout, packed.to_bytes())  # never a slot


def _cpu_processes_on_this_machine(p: Placement) -> bool:
    return not p.same_process and p.src_node is None and p.dst_node is None and not p.src_gpu and not p.dst_gpu


PLUGIN = TransportPlugin(COPY, _cpu_processes_on_this_machine, rank=15, codec=CopyCodec)


def make_plugin() -> TransportPlugin:
    """The same plug-in, for an entry point that names a callable returning it."""
    return PLUGIN
