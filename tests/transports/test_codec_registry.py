"""Codecs are chosen by transport name from a registry; the base module never imports the
modules that subclass it (that was an import cycle)."""

from __future__ import annotations

import numpy as np
import pytest

from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import PayloadCodec, codec_for, decode
from omnictl.transports.shm import SegmentReader, SlotPool


@pytest.fixture
def pool():
    pool = SlotPool("p", "s", 1 << 16, 2)
    yield pool
    pool.close()


KNOBS = RelayKnobs(slot_bytes=1 << 16, slots=2, inline_bytes=64)


@pytest.mark.parametrize("transport", [Transport.SHM, Transport.RELAY])
def test_shm_and_relay_edges_use_the_host_shared_memory_codec(transport: Transport, pool) -> None:
    codec = codec_for(transport, pool, KNOBS)
    assert type(codec) is PayloadCodec
    payload = codec.encode({"x": np.arange(1000, dtype=np.float32)})
    assert payload.shm is not None
    out = decode(payload, SegmentReader())
    assert np.array_equal(out["x"], np.arange(1000, dtype=np.float32))
    pool.release(payload.shm)


def test_cuda_ipc_is_registered_by_its_own_module_on_first_use(pool) -> None:
    from omnictl.transports.cuda_ipc import CudaIpcCodec

    assert type(codec_for(Transport.CUDA_IPC, pool, KNOBS)) is CudaIpcCodec


def test_inproc_edges_have_no_codec(pool) -> None:
    with pytest.raises(ValueError, match="inproc edges pass objects directly"):
        codec_for(Transport.INPROC, pool, KNOBS)
