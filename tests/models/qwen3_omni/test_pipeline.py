"""topologies/qwen3-omni.yaml on the real runtime (processes, ZeroMQ, shared memory), on CPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import Qwen3OmniMoeForConditionalGeneration

import omnictl
from omnictl.coordinator.request import RequestEventKind
from omnictl.models.qwen3_omni import stages
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.topology.model import Topology
from omnictl.topology.validation import loads

from .conftest import request

# Longer than the suite's default deadline: the tiny Qwen3-Omni end to end on CPU, up to ~36 s measured on a loaded 2-core machine
# with warm caches; a cold disk loads the models slower.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # every shipped Qwen topology end to end

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "qwen3-omni.yaml"
MAX_CODES = 10  # a random talker rarely says end-of-speech: bound the audio


def shipped_topology_with_short_audio() -> Topology:
    factory = "factory: omnictl.models.qwen3_omni.stages.talker_ar\n"
    text = TOPOLOGY.read_text()
    assert factory in text
    return loads(text.replace(factory, factory + f"    factory_args: {{max_codes: {MAX_CODES}}}\n"), str(TOPOLOGY))


def test_topology_runs_on_cpu_and_matches_monolithic(tiny_qwen: Path, tmp_path: Path) -> None:
    inputs = request("audio", max_tokens=10)

    async def staged() -> tuple[dict[str, Any], list[Any]]:
        async with omnictl.Pipeline.launch(
            shipped_topology_with_short_audio(), model_path=str(tiny_qwen), device="cpu", run_dir=tmp_path / "run", request_timeout=120.0
        ) as pipe:
            req = await pipe.submit(inputs)
            events = [event async for event in req.events()]
            return await req.result(), events

    results, events = asyncio.run(staged())
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_qwen).eval()
    front = stages.preprocessing(str(tiny_qwen))(inputs)
    sequences, wav = model.generate(
        **front,
        thinker_max_new_tokens=10,
        thinker_do_sample=False,
        thinker_eos_token_id=model.config.im_end_token_id,
        talker_max_new_tokens=MAX_CODES,
        talker_do_sample=False,
    )
    tokenizer_text = stages.decode(str(tiny_qwen)).tokenizer.decode(
        sequences[0, front["input_ids"].shape[1] :].tolist(), skip_special_tokens=True
    )
    assert isinstance(results["decode"], TextResult)
    assert results["decode"].text == tokenizer_text
    text_chunks = [e.data for e in events if e.kind is RequestEventKind.STREAM and e.stage == "decode"]
    assert all(isinstance(chunk, TextDelta) for chunk in text_chunks)
    streamed_text = "".join(chunk.text for chunk in text_chunks)
    assert streamed_text == tokenizer_text
    audio_chunks = [e.data for e in events if e.kind is RequestEventKind.STREAM and e.stage == "code2wav"]
    assert audio_chunks, "code2wav streamed no audio"
    assert all(isinstance(chunk, AudioChunk) and not isinstance(chunk, AudioResult) for chunk in audio_chunks)
    speech = results["code2wav"]
    assert isinstance(speech, AudioResult)
    np.testing.assert_allclose(speech.samples, wav.reshape(-1).numpy(), atol=1e-5)
    assert speech.sample_rate == 24_000


@pytest.mark.parametrize("name", ["qwen3-omni-text.yaml", "qwen3-omni-single-gpu.yaml"])
def test_other_shipped_qwen_topologies_run_on_cpu(name: str, tiny_qwen: Path, tmp_path: Path) -> None:
    path = TOPOLOGY.parent / name
    text = path.read_text()
    factory = "factory: omnictl.models.qwen3_omni.stages.talker_ar\n"
    topology = loads(text.replace(factory, factory + f"    factory_args: {{max_codes: {MAX_CODES}}}\n"), str(path))

    async def run() -> dict[str, Any]:
        async with omnictl.Pipeline.launch(
            topology, model_path=str(tiny_qwen), device="cpu", run_dir=tmp_path / "run", request_timeout=120.0
        ) as pipe:
            req = await pipe.submit(request("image", max_tokens=6))
            return await req.result()

    results = asyncio.run(run())
    assert isinstance(results["decode"], TextResult)
    assert results["decode"].completion_tokens == 6
    if "code2wav" in topology.terminals:
        assert isinstance(results["code2wav"], AudioResult)
        assert results["code2wav"].samples.size > 0
