"""Node labels under the local launcher: edges between labels run over 127.0.0.1 TCP, with
CurveZMQ keys made for the launch. One pipeline for the module (a launch costs seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from omnictl.topology.model import Transport
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.rogue import assert_a_peer_without_the_keys_gets_nothing
from tests.support.stages import seen
from tests.support.wait import until

NODES = {"thinker": {"node": "box-a"}, "talker": {"node": "box-b"}}  # frontend: the coordinator's


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    tmp = tmp_path_factory.mktemp("tcp")
    log = tmp / "seen.log"
    pipeline = launch(loop, topo.qwen_shaped(tmp, log, NODES), device="cpu", profile=True, run_dir=tmp / "run")
    yield pipeline, log
    loop.run(pipeline.close())


async def _collect(pipeline: Any, inputs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    request = await pipeline.submit(inputs)
    events = [event async for event in request.events()]
    return events, await request.result()


def test_qwen_shaped_topology_over_tcp_between_node_labels(loop: LoopThread, pipe) -> None:
    pipeline, log = pipe
    topology = pipeline.topology
    assert topology.edge("mm_aggregate", "thinker").transport is Transport.TCP
    assert topology.edge("thinker", "talker_ar").transport is Transport.TCP
    assert topology.edge("preprocessing", "image_encoder").transport is Transport.INPROC
    events, result = loop.run(_collect(pipeline, {"text": "hello", "tag": "r1"}))
    # every process took tcp on 127.0.0.1 (OS-chosen ports)
    addresses = pipeline._coordinator.endpoint.tcp_addresses
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

    async def abort_then_more() -> str:
        aborted = await pipeline.submit({"text": "hello again", "tag": "r2"})
        await aborted.abort()
        return (await (await pipeline.submit({"text": "world", "tag": "r3"})).result())["decode"].text

    assert loop.run(abort_then_more()) == "world"  # an abort in between left nothing behind
    assert {"preprocessing", "thinker", "talker_ar", "code2wav"} <= set(seen(log))


def test_stats_and_nodes_report_per_node(loop: LoopThread, pipe) -> None:
    pipeline, _ = pipe
    stats = loop.run(pipeline.stats())
    assert stats["thinker"]["node"] == "box-a" and stats["code2wav"]["node"] == "box-b"
    assert stats["preprocessing"]["node"] == "-" and stats["thinker"]["status"] == "up"
    assert pipeline.nodes() == {"-": {"processes": ["frontend"], "status": "up"},
                                "box-a": {"processes": ["thinker"], "status": "up"},
                                "box-b": {"processes": ["talker"], "status": "up"}}


@pytest.mark.parametrize("keys", ["none", "server-key-but-own-client-key"])
def test_a_peer_without_the_launch_keys_gets_nothing_in_and_nothing_out(loop: LoopThread, pipe, keys: str) -> None:
    pipeline, log = pipe
    assert_a_peer_without_the_keys_gets_nothing(loop, pipeline, log, keys)


def test_the_launch_keys_never_show_their_secrets(pipe) -> None:
    keys = pipe[0]._coordinator.wiring.curve
    assert keys.server_secret.decode() not in repr(keys) and keys.client_secret.decode() not in repr(keys)


def test_the_trace_shows_tcp_hops_with_bytes_and_each_stages_node(loop: LoopThread, pipe) -> None:
    import io

    from rich.console import Console

    from omnictl.profiling.rundir import read_run_info
    from omnictl.profiling.spans import build_trace
    from omnictl.profiling.trace_render import render_waterfall

    pipeline, _ = pipe
    rid = "traced-request"
    loop.run(_collect_id(pipeline, {"text": "trace", "tag": "traced"}, rid))
    def shipped() -> bool:  # recorders flush every 50 ms; a loaded machine may take longer
        events = trace_events(pipeline, rid)
        hop_received = any(e.kind.value == "hop_received" and e.stage == "thinker" for e in events)
        return hop_received and {e.process for e in events} >= {"thinker", "talker", "frontend"}

    assert until(shipped, timeout=30)
    trace = build_trace(rid, trace_events(pipeline, rid))
    # labelled processes ship their events to the collector over tcp (CurveZMQ), the others over ipc
    assert pipeline.profile.tcp_address.startswith("tcp://127.0.0.1:")
    assert pipeline._coordinator.launcher.wiring.profile_tcp_address == pipeline.profile.tcp_address
    assert {e.process for e in trace_events(pipeline, rid)} >= {"thinker", "talker", "frontend"}
    hops = {(s.meta["src"], s.meta["dst"]): s for s in trace.of_kind("hop")}
    tcp = hops[("mm_aggregate", "thinker")]
    assert tcp.meta["transport"] == "tcp" and tcp.meta["bytes"] > 0 and tcp.end_ns > tcp.start_ns
    info = read_run_info(pipeline.run_dir)
    assert info is not None
    nodes = {stage.name: stage.node for stage in info.stages}
    assert nodes["thinker"] == "box-a" and nodes["preprocessing"] is None
    console = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    console.print(render_waterfall(trace, width=120, nodes=nodes))
    text = console.export_text()
    assert "thinker on box-a" in text and "preprocessing on -" in text
    assert any("mm_aggregate" in line and "tcp" in line for line in text.splitlines())


async def _collect_id(pipeline: Any, inputs: dict[str, Any], request_id: str) -> dict[str, Any]:
    return await (await pipeline.submit(inputs, request_id=request_id)).result()


def trace_events(pipeline: Any, request_id: str) -> list[Any]:
    return [e for e in pipeline.profile.store.iter_events() if e.request_id == request_id]
