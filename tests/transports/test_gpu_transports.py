"""cuda_ipc and relay: exercised only where a GPU exists (skipped, never failed, on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import decode
from omnictl.transports.registry import codec_for
from omnictl.transports.shm import SegmentReader, SlotPool
from tests.support import topo

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("transport", [Transport.CUDA_IPC, Transport.RELAY])
def test_gpu_codecs_round_trip_device_tensors(transport: Transport) -> None:
    knobs = RelayKnobs(slot_bytes=1 << 20, slots=2, inline_bytes=64)
    pool = SlotPool("p", "s", knobs.slot_bytes, knobs.slots)
    codec = codec_for(transport, pool, knobs)
    tensor = torch.arange(4096, dtype=torch.float32, device="cuda:0")
    payload = codec.encode({"t": tensor, "host": torch.ones(10_000)})
    out = decode(payload, SegmentReader())
    assert torch.equal(out["t"].to("cuda:0"), tensor)
    assert torch.equal(out["host"], torch.ones(10_000))
    pool.close()


@cuda
def test_gpu_placed_topology_runs(tmp_path: Path) -> None:
    import omnictl

    gpus = torch.cuda.device_count()
    path = topo.write(
        tmp_path / "gpu.yaml",
        [
            {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"], "gpu": 0, "process": "one"},
            {"name": "b", "factory": "omnictl.models.examples.identity", "next": ["c"], "gpu": 0, "process": "two"},
            {"name": "c", "factory": "omnictl.models.examples.identity", "terminal": True,
             "gpu": 1 if gpus > 1 else 0, "process": "three"},
        ],
    )
    out = omnictl.run(path, {"x": torch.ones(8, device="cuda:0")}, profile=False)
    assert torch.equal(out["c"]["x"].cpu(), torch.ones(8))
