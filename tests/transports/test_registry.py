"""The transport registry: placement picks a transport by rank, each has its codec, plug-ins
come from entry points."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports import registry
from omnictl.transports.codec import PayloadCodec, decode
from omnictl.transports.cuda_ipc import CudaIpcCodec
from omnictl.transports.registry import Placement, TransportPlugin, codec_for
from omnictl.transports.shm import SegmentReader, SlotPool
from omnictl.transports.tcp import TcpCodec


@pytest.fixture
def pool():
    pool = SlotPool("p", "s", 1 << 16, 2)
    yield pool
    pool.close()


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test do not outlive it."""
    monkeypatch.setattr(registry, "_PLUGINS", dict(registry._PLUGINS))


KNOBS = RelayKnobs(slot_bytes=1 << 16, slots=2, inline_bytes=64)


def test_transport_kinds_are_one_object_per_name() -> None:
    assert Transport("shm") is Transport.SHM and Transport("tcp") is Transport.TCP
    assert Transport("made-up") is Transport("made-up") and Transport("made-up") is not Transport.SHM
    assert (str(Transport.RELAY), repr(Transport.CUDA_IPC)) == ("relay", "Transport('cuda_ipc')")
    with pytest.raises(AttributeError):
        Transport.SHM.value = "tcp"  # type: ignore[misc]  # immutable


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (Placement(True), Transport.INPROC),
        (Placement(True, "a", "b"), Transport.INPROC),  # one process is on one node
        (Placement(False, None, "gpu-box"), Transport.TCP),
        (Placement(False, "x", "y", (0,), (0,)), Transport.TCP),
        (Placement(False), Transport.SHM),
        (Placement(False, "n", "n", (0,), ()), Transport.SHM),
        (Placement(False, None, None, (1, 2), (1,)), Transport.CUDA_IPC),  # rank 0's GPU decides
        (Placement(False, None, None, (0,), (1,)), Transport.RELAY),
    ],
)
def test_placement_selects_the_first_transport_by_rank(placement: Placement, expected: Transport) -> None:
    assert registry.select(placement) is expected


@pytest.mark.parametrize(("transport", "codec"), [(Transport.SHM, PayloadCodec), (Transport.RELAY, PayloadCodec),
                                                  (Transport.TCP, TcpCodec), (Transport.CUDA_IPC, CudaIpcCodec)])
def test_each_cross_process_transport_has_its_codec(transport: Transport, codec: type, pool: SlotPool) -> None:
    built = codec_for(transport, pool, KNOBS, allow_pickle=True)
    assert type(built) is codec and (built.pool, built.knobs, built.allow_pickle) == (pool, KNOBS, True)


def test_the_shared_memory_codec_round_trips_through_a_slot(pool: SlotPool) -> None:
    payload = codec_for(Transport.SHM, pool, KNOBS).encode({"x": np.arange(1000, dtype=np.float32)})
    assert payload.shm is not None
    assert np.array_equal(decode(payload, SegmentReader())["x"], np.arange(1000, dtype=np.float32))
    pool.release(payload.shm)


def test_inproc_edges_have_no_codec(pool: SlotPool) -> None:
    with pytest.raises(ValueError, match="inproc edges pass objects directly"):
        codec_for(Transport.INPROC, pool, KNOBS)


def test_an_unregistered_transport_is_named_with_those_that_are(pool: SlotPool) -> None:
    with pytest.raises(LookupError, match=r"no transport 'carrier-pigeon' is registered .*registered: cuda_ipc, "
                                          r"inproc, relay, shm, tcp.*plug-in"):
        codec_for(Transport("carrier-pigeon"), pool, KNOBS)


def test_a_registered_transport_wins_placement_by_rank_and_brings_its_codec(clean_registry: None,
                                                                            pool: SlotPool) -> None:
    class Marked(PayloadCodec):
        pass

    mine = Transport("test-mine")
    registry.register(TransportPlugin(mine, lambda p: p.src_node == "lab", rank=5, codec=Marked))
    assert registry.select(Placement(False, "lab", None)) is mine  # before tcp (rank 10)
    assert registry.select(Placement(False, "elsewhere", None)) is Transport.TCP
    assert type(codec_for(mine, pool, KNOBS)) is Marked
    assert [p.kind.value for p in registry.plugins()][:3] == ["inproc", "test-mine", "tcp"]


def test_plug_ins_are_found_through_entry_points(clean_registry: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "omnictl_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omnictl-test-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omnictl.transports]\ncopy = tests.transports.plugin.copy_transport:PLUGIN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_discovered", False)
    assert registry.select(Placement(False, None, None)) is Transport("copy")
    assert registry.plugin(Transport("copy")).codec.__name__ == "CopyCodec"  # type: ignore[union-attr]


def test_an_entry_point_that_is_no_plugin_is_refused_naming_it(clean_registry: None, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omnictl.transports]\nbad = json:__name__\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_discovered", False)
    with pytest.raises(TypeError, match=r"entry point 'bad' \(json:__name__\) .* gave a str, not a TransportPlugin"):
        registry.plugins()


def test_an_entry_point_may_name_a_callable_returning_the_plugin_and_discovery_runs_once(
        clean_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dist = tmp_path / "omnictl_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omnictl-test-plugin\nVersion: 1.0\n")
    value = "tests.transports.plugin.copy_transport:make_plugin"
    (dist / "entry_points.txt").write_text(f"[omnictl.transports]\ncopy = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_discovered", False)
    with caplog.at_level(logging.DEBUG, logger=registry.log.name):
        assert Transport("copy") in [p.kind for p in registry.plugins()]
        registry.plugins()  # the environment is read once per process
    assert [r.getMessage() for r in caplog.records] == [f"transport 'copy' registered by {value}"]
