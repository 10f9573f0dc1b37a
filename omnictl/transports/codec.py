"""Encode a payload for a cross-process edge, and decode it on arrival.

The transport is derived from placement (see ``omnictl.topology.derive``); every
cross-process transport is a :class:`PayloadCodec` so the Stage never branches on it.
``inproc`` edges pass the object itself and use no codec.
"""

from __future__ import annotations

from typing import Any

from omnictl.messages import EncodedPayload
from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.packing import pack, unpack
from omnictl.transports.shm import SegmentReader, SlotPool


class PayloadCodec:
    """Shared-memory codec (``shm``): tiny payloads inline, the rest in a reusable slot."""

    transport = Transport.SHM

    def __init__(self, pool: SlotPool, knobs: RelayKnobs) -> None:
        self.knobs = knobs
        self.pool = pool  # the sending stage's, shared by all its cross-process edges

    def encode(self, data: Any) -> EncodedPayload:
        packed = pack(data, device_leaf=self._device_leaf())
        if packed.nbytes <= self.knobs.inline_bytes:
            return EncodedPayload(packed.skeleton, packed.layout, packed.to_bytes())
        ref, view = self.pool.acquire(packed.nbytes)
        packed.write_into(view)
        view.release()
        return EncodedPayload(packed.skeleton, packed.layout, shm=ref)

    def _device_leaf(self) -> Any:
        return None  # GPU tensors are staged through host memory


def decode(payload: EncodedPayload, reader: SegmentReader) -> Any:
    """Rebuild the data; the caller sends ``SlotRelease(payload.shm)`` afterwards."""
    if payload.shm is None:
        return unpack(payload.skeleton, payload.layout, payload.inline)
    view = reader.read(payload.shm)
    try:
        return unpack(payload.skeleton, payload.layout, view)
    finally:
        view.release()


def codec_for(transport: Transport, pool: SlotPool, knobs: RelayKnobs) -> PayloadCodec:
    if transport is Transport.CUDA_IPC:
        from omnictl.transports.cuda_ipc import CudaIpcCodec

        return CudaIpcCodec(pool, knobs)
    if transport is Transport.RELAY:
        from omnictl.transports.relay import RelayCodec

        return RelayCodec(pool, knobs)
    if transport is Transport.SHM:
        return PayloadCodec(pool, knobs)
    raise ValueError(f"{transport.value} edges pass objects directly and use no codec")
