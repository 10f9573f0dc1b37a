"""Codecs are chosen by transport name from a registry; the base module never imports the
modules that subclass it (that was an import cycle)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports import codec as codec_module
from omnictl.transports.codec import PayloadCodec, codec_for, decode, register_codec
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


def test_cuda_ipc_is_registered_by_its_own_module_on_first_use(pool, monkeypatch: pytest.MonkeyPatch) -> None:
    # As in a fresh stage process: the module is not imported yet, so nothing registered it.
    monkeypatch.delitem(sys.modules, "omnictl.transports.cuda_ipc", raising=False)
    monkeypatch.delitem(codec_module._CODECS, Transport.CUDA_IPC, raising=False)
    codec = codec_for(Transport.CUDA_IPC, pool, KNOBS)
    assert type(codec) is sys.modules["omnictl.transports.cuda_ipc"].CudaIpcCodec
    assert (codec.pool, codec.knobs) == (pool, KNOBS)
    assert codec_module._CODECS[Transport.CUDA_IPC] is type(codec)


def test_a_module_that_registers_nothing_is_named(pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(codec_module._CODECS, Transport.CUDA_IPC, raising=False)
    monkeypatch.setitem(codec_module._CODEC_MODULES, Transport.CUDA_IPC, "json")
    with pytest.raises(LookupError, match=r"^importing json registered no codec for cuda_ipc edges$"):
        codec_for(Transport.CUDA_IPC, pool, KNOBS)


def test_register_codec_replaces_the_codec_of_a_transport(pool, monkeypatch: pytest.MonkeyPatch) -> None:
    class Custom(PayloadCodec):
        pass

    monkeypatch.setitem(codec_module._CODECS, Transport.RELAY, codec_module._CODECS[Transport.RELAY])
    register_codec(Transport.RELAY, Custom)
    assert type(codec_for(Transport.RELAY, pool, KNOBS)) is Custom
    assert type(codec_for(Transport.SHM, pool, KNOBS)) is PayloadCodec


def test_inproc_edges_have_no_codec(pool) -> None:
    with pytest.raises(ValueError, match="inproc edges pass objects directly"):
        codec_for(Transport.INPROC, pool, KNOBS)
