"""topologies/higgs-audio.yaml on the real runtime (processes, sockets, shared memory), on CPU,
against transformers' greedy ``generate`` on the same tiny checkpoint: through the Python
API (with a terminal that shows the generator's frames) and served (``omnictl serve`` in process):
``/v1/audio/speech`` raw and as server-sent events, chat completions with audio out, the trace."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import uuid
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import omnictl
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore
from omnictl.request import RequestEventKind
from omnictl.serving.config import HttpConfig, ServeConfig
from tests.serving.harness import serving_in_process
from tests.support.family_pipeline import Served, served_then_aborted, with_result_terminal

from .conftest import FRAMES, TEXT

# Two launches of two processes, a model load each: ~a minute on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "higgs-audio.yaml"
GREEDY = {"temperature": 0, "max_tokens": FRAMES}
STAGES = {"preprocessing", "generator", "audio_decoder"}


def test_served_higgs_audio_is_transformers_greedy_output_streamed_and_traced(
    tiny_higgs: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"

    # The shipped topology, plus a terminal that returns the generator's result (the client
    # hears only audio otherwise): its frames and codes are compared frame by frame.
    topology = with_result_terminal(TOPOLOGY, after="next: [audio_decoder]", name="frames", process="higgs")

    async def run() -> Served:
        async with omnictl.Pipeline.launch(
            topology, model_path=str(tiny_higgs), device="cpu", run_dir=run_dir, profile=True
        ) as pipe:
            # Then one aborted after its first audio (a long request: the random model is told to
            # go on): nothing is left.
            return await served_then_aborted(
                pipe,
                {"text": TEXT, "sampling": GREEDY},
                {
                    "text": "The quick brown fox jumps over the lazy dog.",
                    "sampling": {"temperature": 0.9, "seed": 3, "max_tokens": 500},
                },
            )

    served = asyncio.run(run())
    request_id, result, events, early, held = served.request_id, served.result, served.events, served.early, served.held
    made = result["frames"]
    # Text tokens, frames (every codebook, delayed as generated) and codec frames: exactly transformers'.
    assert made.token_ids == reference["tokens"][:-1]  # the end-of-turn token stops it and is not kept
    assert torch.equal(torch.as_tensor(made.frames), reference["frames"])
    assert torch.equal(torch.as_tensor(made.codes), reference["codes"])
    # The waveform: the audio tokenizer's decode of those frames, streamed as they complete.
    chunks = [e.data for e in events if e.kind is RequestEventKind.STREAM and e.stage == "audio_decoder"]
    assert len(chunks) > 2 and all(isinstance(c, AudioChunk) for c in chunks)
    audio = result["audio_decoder"]
    assert isinstance(audio, AudioResult) and audio.sample_rate == 24_000
    np.testing.assert_allclose(audio.samples, reference["audio"], atol=1e-5)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), audio.samples)
    assert early, "no audio chunk arrived before the request completed"
    assert held == []
    trace = build_trace(request_id, TraceStore(run_dir).events(request_id))
    assert trace.status == "completed"
    assert set(trace.stages) >= STAGES


def test_speech_route_and_its_sse_form_give_transformers_audio(
    tiny_higgs: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = ServeConfig(topology=str(TOPOLOGY), http=HttpConfig(port=0)).launching(
        model_path=str(tiny_higgs), device="cpu", run_dir=run_dir
    )
    body = {"model": "higgs-audio", "input": TEXT, "response_format": "pcm", "temperature": 0, "max_new_tokens": FRAMES}
    with serving_in_process(config, "in-process omnictl serve (higgs-audio)") as served:
        traced = f"higgs-raw-{uuid.uuid4().hex[:8]}"
        raw = httpx.post(served.url + "/v1/audio/speech", json=body, timeout=120, headers={"X-Request-Id": traced})
        assert raw.status_code == 200, raw.text
        pcm = np.frombuffer(raw.content, dtype="<i2").astype(np.float32) / 32768
        assert len(pcm) == len(reference["audio"])
        np.testing.assert_allclose(pcm, reference["audio"], atol=1e-4)  # PCM16's step is 3e-5
        deltas = []
        with httpx.stream(
            "POST",
            served.url + "/v1/audio/speech",
            json={**body, "stream_format": "sse"},
            timeout=120,
            headers={"X-Request-Id": f"higgs-{uuid.uuid4().hex[:8]}"},
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    deltas.append(json.loads(line[len("data: ") :]))
        assert [d["type"] for d in deltas[:-1]] == ["speech.audio.delta"] * (len(deltas) - 1) and len(deltas) > 2
        assert deltas[-1]["type"] == "speech.audio.done"
        streamed = b"".join(base64.b64decode(d["audio"]) for d in deltas[:-1])
        assert streamed == raw.content  # greedy: the same audio, in pieces
        assert raw.headers.get("x-request-id") == traced
        bad = httpx.post(served.url + "/v1/audio/speech", json={**body, "voice": "someone"}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "voice", bad.text
        # Chat completions with audio out: the same turns (the system prompt, then the user's),
        # so the same greedy speech, as WAV (FFmpeg's encoder: within a step of PCM16).
        chat = httpx.post(
            served.url + "/v1/chat/completions",
            json={
                "model": "higgs-audio",
                "messages": [{"role": "user", "content": TEXT}],
                "modalities": ["audio"],
                "audio": {"voice": "alloy", "format": "wav"},
                "temperature": 0,
                "max_tokens": FRAMES,
            },
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        with wave.open(io.BytesIO(base64.b64decode(chat.json()["choices"][0]["message"]["audio"]["data"]))) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
            spoken = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32768
        assert len(spoken) == len(reference["audio"])
        np.testing.assert_allclose(spoken, reference["audio"], atol=1e-4)
        # The raw request's trace has every stage (stages send their records in batches).
        deadline = time.monotonic() + 20
        while not STAGES <= (stages := traced_stages(run_dir, traced)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert STAGES <= stages, sorted(stages)


def traced_stages(run_dir: Path, request_id: str) -> set[str]:
    return {event.stage for event in TraceStore(run_dir).events(request_id)} - {None, ""}
