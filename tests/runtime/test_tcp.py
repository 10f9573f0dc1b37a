"""Node labels under the local launcher: the edges between labels run over 127.0.0.1 TCP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

import omnictl
from omnictl.topology.model import Transport
from tests.support import topo
from tests.support.stages import seen

NODES = {"thinker": {"node": "box-a"}, "talker": {"node": "box-b"}}  # frontend: the coordinator's


def test_qwen_shaped_topology_over_tcp_between_node_labels(tmp_path: Path) -> None:
    log = tmp_path / "seen.log"
    path = topo.qwen_shaped(tmp_path, log, NODES)

    async def main() -> tuple[list[omnictl.RequestEvent], dict, dict[str, str], list[str]]:
        async with omnictl.Pipeline.launch(path, device="cpu", profile=False) as pipe:
            topology = pipe.topology
            assert topology.edge("mm_aggregate", "thinker").transport is Transport.TCP
            assert topology.edge("thinker", "talker_ar").transport is Transport.TCP
            assert topology.edge("preprocessing", "image_encoder").transport is Transport.INPROC
            request = await pipe.submit({"text": "hello", "tag": "r1"})
            events = [event async for event in request.events()]
            result = await request.result()
            aborted = await pipe.submit({"text": "hello again", "tag": "r2"})
            await aborted.abort()
            follow = await (await pipe.submit({"text": "world", "tag": "r3"})).result()
            addresses = dict(pipe._coordinator._tcp_addresses)
            return events, result, addresses, [follow["decode"].text]

    events, result, addresses, follow = asyncio.run(main())
    # the labelled processes took tcp on 127.0.0.1 (OS-chosen ports); the frontend needs none
    assert set(addresses) == {"frontend", "thinker", "talker"}
    assert all(a.startswith("tcp://127.0.0.1:") for a in addresses.values())
    assert result["decode"].text == "hello"
    codes = [sum(range(4 * i, 4 * i + 4)) for i in range(5)]
    expected = np.concatenate([np.full(8, c / 100.0, dtype=np.float32) for c in codes])
    np.testing.assert_allclose(result["code2wav"].samples, expected)  # tensors crossed two tcp hops
    text_events = [e for e in events if e.stage == "decode"]
    assert [e.kind for e in text_events] == ["stream"] * 5 + ["result"]
    assert "".join(e.data.text for e in text_events[:-1]) == "hello"  # stream order over tcp
    assert [e.kind for e in events if e.stage == "code2wav"] == ["stream"] * 5 + ["result"]
    assert follow == ["world"]  # an abort in between left nothing behind
    assert {"preprocessing", "thinker", "talker_ar", "code2wav"} <= set(seen(log))
