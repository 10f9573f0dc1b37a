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
from omnictl.request import RequestEventKind, RequestState
from omnictl.topology.validation import loads
from tests.support.held import held_by

from .conftest import FRAMES, TEXT

# Two processes and a model load each: ~20 s on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "csm.yaml"
GREEDY = {"temperature": 0, "max_tokens": FRAMES}


def with_codes_terminal() -> Any:
    """The shipped topology, plus a terminal that returns the depth decoder's frames (the
    client sees only audio otherwise): the codes are compared frame by frame."""
    text = TOPOLOGY.read_text()
    old = "    next: [mimi_decoder]\n"
    assert old in text
    text = text.replace(old, "    next: [mimi_decoder, codes]\n")
    text += (
        "\n  - name: codes\n    factory: omnictl.models.examples.identity\n    process: csm\n"
        "    terminal: true\n    modality: codes\n"
    )
    return loads(text, str(TOPOLOGY))


def test_served_csm_is_transformers_greedy_output_streamed_and_traced(
    tiny_csm: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"

    async def run() -> tuple[str, dict[str, Any], list[Any], bool, list[str]]:
        async with omnictl.Pipeline.launch(
            with_codes_terminal(), model_path=str(tiny_csm), device="cpu", run_dir=run_dir, profile=True
        ) as pipe:
            request = await pipe.submit({"text": TEXT, "sampling": GREEDY})
            events, early = [], False
            async for event in request.events():
                events.append(event)
                if event.kind is RequestEventKind.STREAM and request.state is RequestState.RUNNING:
                    early = True  # audio came while the request was still running
            result = await request.result()
            # Aborted after its first audio: nothing is left anywhere.
            aborted = await pipe.submit({"text": TEXT, "sampling": {"temperature": 0, "max_tokens": 200}})
            async for event in aborted.events():
                if event.kind is RequestEventKind.STREAM:
                    await pipe.abort(aborted.id)
                    break
            return request.id, result, events, early, await held_by(pipe)

    request_id, result, events, early, held = asyncio.run(run())
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
