"""topologies/csm.yaml on the real runtime (processes, sockets, shared memory), on CPU,
against transformers' greedy ``generate`` on the same tiny checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import omnictl
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore
from omnictl.request import RequestEventKind
from tests.support.family_pipeline import Served, served_then_aborted, with_result_terminal

from .conftest import FRAMES, TEXT

# Two processes and a model load each: ~20 s on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "csm.yaml"
GREEDY = {"temperature": 0, "max_tokens": FRAMES}


def test_served_csm_is_transformers_greedy_output_streamed_and_traced(
    tiny_csm: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"

    # The shipped topology, plus a terminal that returns the depth decoder's frames (the
    # client sees only audio otherwise): the codes are compared frame by frame.
    topology = with_result_terminal(TOPOLOGY, after="next: [mimi_decoder]", name="codes", process="csm")

    async def run() -> Served:
        async with omnictl.Pipeline.launch(
            topology, model_path=str(tiny_csm), device="cpu", run_dir=run_dir, profile=True
        ) as pipe:
            # Then one aborted after its first audio: nothing is left anywhere.
            return await served_then_aborted(
                pipe,
                {"text": TEXT, "sampling": GREEDY},
                {"text": TEXT, "sampling": {"temperature": 0, "max_tokens": 200}},
            )

    served = asyncio.run(run())
    request_id, result, events, early, held = served.request_id, served.result, served.events, served.early, served.held
    # Codes, frame by frame: exactly transformers' greedy frames.
    assert torch.equal(torch.as_tensor(result["codes"]["codes"]), reference["codes"])
    # The waveform: Mimi's decode of those frames, streamed a frame at a time.
    chunks = [e.data for e in events if e.kind is RequestEventKind.STREAM and e.stage == "mimi_decoder"]
    assert len(chunks) == FRAMES and all(isinstance(c, AudioChunk) and c.samples.size == 1920 for c in chunks)
    audio = result["mimi_decoder"]
    assert isinstance(audio, AudioResult) and audio.sample_rate == 24_000
    np.testing.assert_allclose(audio.samples, reference["audio"], atol=1e-4)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), audio.samples)
    assert early, "no audio chunk arrived before the request completed"
    assert held == []
    trace = build_trace(request_id, TraceStore(run_dir).events(request_id))
    assert trace.status == "completed"
    assert set(trace.stages) >= {"preprocessing", "backbone", "depth", "mimi_decoder"}
