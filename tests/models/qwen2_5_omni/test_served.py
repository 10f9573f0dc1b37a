"""topologies/qwen2.5-omni.yaml on the real runtime (processes, ZeroMQ, shared memory) and
the real HTTP server, on CPU, against transformers' greedy ``generate`` on the same tiny
checkpoint: the thinker's text tokens and the talker's codes exactly; the waveform within
float tolerance when token2wav decodes the whole answer (``chunk_frames: 0``) with the
noise transformers draws after the same seed; streamed (in windows) its length and level."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

import omnictl
from omnictl.outputs import AudioChunk, AudioResult, TextResult
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore
from omnictl.request import RequestEventKind, RequestState
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening
from omnictl.topology.validation import loads
from tests.serving.harness import serving_in_process
from tests.support.held import held_by

from .conftest import MAX_CODES, MAX_TOKENS, Reference, request

# Two processes and a model load each, twice: tens of seconds on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "qwen2.5-omni.yaml"
STAGES = {"preprocessing", "thinker", "decode", "talker", "token2wav"}
SAMPLES_PER_CODE = 480  # two mel frames of 240 samples


def topology(*, token2wav: str, codes_terminal: bool = False) -> str:
    """The shipped topology with the talker bounded to MAX_CODES, token2wav's ``factory_args``
    set, and (``codes_terminal``) one more terminal that returns the talker's codes."""
    text = TOPOLOGY.read_text()
    talker = "    factory: omnictl.models.qwen2_5_omni.stages.talker\n"
    vocoder = "    factory: omnictl.models.qwen2_5_omni.stages.token2wav\n"
    assert talker in text and vocoder in text
    text = text.replace(talker, talker + f"    factory_args: {{max_codes: {MAX_CODES}}}\n")
    text = text.replace(vocoder, vocoder + f"    factory_args: {token2wav}\n")
    if codes_terminal:
        old = "    next: [token2wav]\n"
        assert old in text
        text = text.replace(old, "    next: [token2wav, codes]\n")
        text += (
            "\n  - name: codes\n    factory: omnictl.models.examples.identity\n    process: talker\n"
            "    terminal: true\n    modality: codes\n"
        )
    return text


def test_the_pipeline_gives_transformers_greedy_output_streams_aborts_and_traces(
    tiny_qwen25: Path, reference: Reference, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shipped = loads(topology(token2wav="{chunk_frames: 0}", codes_terminal=True), str(TOPOLOGY))
    asked = {"text": request("text"), "audio": request("audio", voice="Ethan")}

    async def run() -> tuple[dict[str, Any], dict[str, list[Any]], list[str], str, list[str]]:
        async with omnictl.Pipeline.launch(
            shipped, model_path=str(tiny_qwen25), device="cpu", run_dir=run_dir, profile=True, request_timeout=300.0
        ) as pipe:
            results, events, early = {}, {}, []
            for kind, inputs in asked.items():
                submitted = await pipe.submit(inputs)
                events[kind] = []
                async for event in submitted.events():
                    events[kind].append(event)
                    if event.kind is RequestEventKind.STREAM and submitted.state is RequestState.RUNNING:
                        early.append(f"{kind}:{event.stage}")
                results[kind] = await submitted.result()
                traced = submitted.id
            # Aborted after its first text chunk: nothing is left anywhere.
            aborted = await pipe.submit(request("text", max_tokens=200))
            async for event in aborted.events():
                if event.kind is RequestEventKind.STREAM:
                    await pipe.abort(aborted.id)
                    break
            return results, events, early, traced, await held_by(pipe)

    results, events, early, traced, held = asyncio.run(run())
    tokenizer = reference.preprocess.processor.tokenizer
    for kind, inputs in asked.items():
        expected = reference.generate(inputs)
        text = results[kind]["decode"]
        assert isinstance(text, TextResult)
        assert text.text == tokenizer.decode(expected["tokens"], skip_special_tokens=True), kind
        assert text.completion_tokens == len(expected["tokens"]) == MAX_TOKENS
        assert results[kind]["codes"].codes.reshape(-1).tolist() == expected["codes"], kind
        audio = results[kind]["token2wav"]
        assert isinstance(audio, AudioResult) and audio.sample_rate == 24_000
        assert audio.samples.shape == expected["wav"].shape == (len(expected["codes"]) * SAMPLES_PER_CODE,)
        np.testing.assert_allclose(audio.samples, expected["wav"], atol=1e-5)
        chunks = [e.data for e in events[kind] if e.kind is RequestEventKind.STREAM and e.stage == "token2wav"]
        assert all(isinstance(chunk, AudioChunk) for chunk in chunks)
        np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), audio.samples)
    # The text streams while the talker and token2wav are still at work.
    assert "text:decode" in early and "audio:decode" in early
    assert held == []
    trace = build_trace(traced, TraceStore(run_dir).events(traced))
    assert trace.status == "completed"
    assert set(trace.stages) >= STAGES


@pytest.fixture(scope="module")
def served(tiny_qwen25: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:
    """The shipped topology as shipped but for small windows (2 codes first, then 4)."""
    path = tmp_path_factory.mktemp("topology") / "qwen2.5-omni.yaml"
    path.write_text(topology(token2wav="{chunk_frames: 4, first_chunk_frames: 2}"))
    config = ServeConfig(topology=str(path), http=HttpConfig(port=0)).launching(
        model_path=str(tiny_qwen25), device="cpu", run_dir=tmp_path_factory.mktemp("run")
    )
    with serving_in_process(config, "in-process omnictl serve (qwen2.5-omni)") as listening:
        yield listening


def chat_body(kind: str, **extra: Any) -> dict[str, Any]:
    body = request(kind)
    messages = body["messages"]
    if kind == "audio":  # over HTTP the clip travels as base64 WAV
        from benchmarks.eval.samples import wav_bytes

        clip = messages[1]["content"][1]["input_audio"]["data"]
        messages[1]["content"][1]["input_audio"] = {
            "data": base64.b64encode(wav_bytes(clip, 16_000)).decode(),
            "format": "wav",
        }
    return {
        "model": "qwen2.5-omni",
        "messages": messages,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16", "voice": "Chelsie"},
        **extra,
    }


def test_chat_completions_streams_transformers_text_and_windowed_speech(
    served: Listening, reference: Reference
) -> None:
    expected = reference.generate(request("audio"))
    text, pieces, finished = "", [], False
    with httpx.stream(
        "POST", served.url + "/v1/chat/completions", json=chat_body("audio", stream=True), timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"]
            text += delta.get("content") or ""
            if "audio" in delta:
                assert not finished, "audio after the finish reason"
                pieces.append(base64.b64decode(delta["audio"]["data"]))
            finished = finished or choice["finish_reason"] is not None
    assert text == reference.preprocess.processor.tokenizer.decode(expected["tokens"], skip_special_tokens=True)
    assert len(pieces) >= 2, "the speech came in one piece"
    # Decoded in windows as the codes came: every code's samples, in several pieces. (The
    # tiny BigVGAN's random weights speak at about 1e-8, below PCM16's step: the samples
    # themselves are compared in process, test_token2wav.py.)
    assert sum(len(piece) for piece in pieces) == 2 * expected["wav"].shape[0]


def test_chat_completions_whole_answer_and_an_unknown_voice(served: Listening) -> None:
    body = chat_body("text")
    body["audio"]["format"] = "wav"
    answer = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert message["content"] and message["audio"]["data"]
    body["audio"]["voice"] = "nobody"
    refused = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=300)
    assert refused.status_code == 400, refused.text
    assert "nobody" in refused.text and "Chelsie" in refused.text
