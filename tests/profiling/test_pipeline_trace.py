"""End to end: a request through the 8-stage topology (3 real processes) leaves a trace
with every stage and hop it crossed, readable after the pipeline stopped."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from omnictl.pipeline import Pipeline
from omnictl.profiling.chrome import to_chrome
from omnictl.profiling.events import EventKind
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore, read_run_info
from omnictl.profiling.trace_render import render_waterfall
from omnictl.topology.model import EdgeKind
from tests.support import topo

# Longer than the suite's default deadline: eight stages in several processes, up to ~12 s
# measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)


def test_a_request_through_eight_stages_is_traced(tmp_path: Path) -> None:
    path = topo.qwen_shaped(tmp_path, tmp_path / "seen.log")
    run_dir = tmp_path / "run"

    async def main() -> tuple[str, Pipeline]:
        async with Pipeline.launch(path, device="cpu", run_dir=run_dir, profile=True) as pipe:
            request = await pipe.submit({"text": "hello", "tag": "r1"})
            await request.result()
            return request.id, pipe

    request_id, pipe = asyncio.run(main())
    topology = pipe.topology
    events = TraceStore(run_dir).events(request_id)  # after the pipeline has stopped
    trace = build_trace(request_id, events)
    assert trace.status == "completed"
    assert set(trace.stages) == set(topology.stages)
    hops = {(s.meta["src"], s.meta["dst"]) for s in trace.of_kind("hop") if s.meta.get("received", True)}
    assert hops >= {(e.src, e.dst) for e in topology.edges if e.kind is EdgeKind.DATA}
    # Stream edges are crossed only where the upstream actually streamed: every chunk sent
    # is matched to its receipt.
    sent_chunks = [e for e in events if e.kind is EventKind.STREAM_SENT]
    streams = [s for s in trace.of_kind("stream") if s.meta.get("received", True)]
    assert sent_chunks and len(streams) == len(sent_chunks)
    assert ("thinker", "talker_ar") in {(s.meta["src"], s.meta["dst"]) for s in streams}
    marks = {s.name for s in trace.of_kind("mark")}
    assert {"first_text", "first_audio"} <= marks
    request = trace.request
    for span in trace.spans:
        assert span.end_ns >= span.start_ns, span
        assert request.start_ns <= span.start_ns and span.end_ns <= request.end_ns, span
        assert not span.meta.get("clipped"), f"a completed request's spans lie inside it naturally: {span}"
    for stage in topology.stages:
        assert trace.stage_process[stage] == topology.process_of(stage)
    info = read_run_info(run_dir)
    assert info is not None and info.topology == "qwen-shaped"
    chrome = json.loads(json.dumps(to_chrome(trace)))
    assert sum(1 for e in chrome["traceEvents"] if e["ph"] == "s") == len(trace.of_kind("hop", "stream"))
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    console.print(render_waterfall(trace))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line.split()[0] for line in lines[3 : 3 + len(topology.stages)]] == trace.stages
