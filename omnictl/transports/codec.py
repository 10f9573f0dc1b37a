"""Encode a payload for a cross-process edge, and decode it on arrival.

The transport is derived from placement (see ``omnictl.topology.derive``); every
cross-process transport has a :class:`PayloadCodec`, so the Stage never branches on it.
``inproc`` edges pass the object itself and use no codec.

Which codec each transport uses is registered in :mod:`omnictl.transports.registry`,
which imports this base module and its subclasses; this module imports none of them.

- ``shm``: host shared memory (this module).
- ``relay`` (stages on different GPUs): the same host-staged shared memory as ``shm``.
  Device tensors are copied to host memory on the way and arrive on the CPU; the
  receiving stage moves them to its own device. No device-to-device path is built yet.
- ``cuda_ipc`` (different processes, same GPU): :mod:`omnictl.transports.cuda_ipc`.
- ``tcp`` (processes on different nodes): :mod:`omnictl.transports.tcp`; the tensors travel
  as extra ZeroMQ frames of the message (see :meth:`PayloadCodec.encode_frames`).
"""

from __future__ import annotations

from typing import Any, Callable

from omnictl.messages import EncodedPayload
from omnictl.transports.kinds import RelayKnobs
from omnictl.transports.packing import pack, unpack, unpack_frames
from omnictl.transports.shm import SegmentReader, SlotPool


class PayloadCodec:
    """Shared-memory codec (``shm``, ``relay``): tiny payloads inline, the rest in a
    reusable slot. GPU tensors are staged through host memory."""

    def __init__(self, pool: SlotPool, knobs: RelayKnobs, allow_pickle: bool = False) -> None:
        self.knobs = knobs
        self.pool = pool  # the sending stage's, shared by all its cross-process edges
        self.allow_pickle = allow_pickle  # the topology's `allow_pickle`

    def encode(self, data: Any) -> EncodedPayload:
        packed = pack(data, device_leaf=self._device_leaf(), allow_pickle=self.allow_pickle)
        if packed.nbytes <= self.knobs.inline_bytes:
            return EncodedPayload(packed.skeleton, packed.layout, packed.to_bytes())
        ref, view = self.pool.acquire(packed.nbytes)
        packed.write_into(view)
        view.release()
        return EncodedPayload(packed.skeleton, packed.layout, shm=ref)

    def encode_frames(self, data: Any) -> tuple[EncodedPayload, list[memoryview]]:
        """The payload and the buffers to send after it as frames of the same message
        (none but for ``tcp``)."""
        return self.encode(data), []

    def _device_leaf(self) -> Callable[[Any], bytes] | None:
        """How GPU tensor leaves are serialized; None copies their bytes to the host."""
        return None


def decode(
    payload: EncodedPayload,
    reader: SegmentReader,
    allow_pickle: bool = False,
    *,
    frames: list[memoryview] | None = None,
) -> Any:
    """Rebuild the data; the caller sends ``SlotRelease(payload.shm)`` afterwards.
    ``frames``: the buffers that came after the message (``tcp``)."""
    if payload.frames:
        return unpack_frames(payload.skeleton, payload.layout, frames or [], allow_pickle)
    if payload.shm is None:
        return unpack(payload.skeleton, payload.layout, payload.inline, allow_pickle)
    view = reader.read(payload.shm)
    try:
        return unpack(payload.skeleton, payload.layout, view, allow_pickle)
    finally:
        view.release()
