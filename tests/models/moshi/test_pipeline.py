"""topologies/moshi.yaml on the real runtime (processes, sockets, shared memory), on CPU: one
session-long streaming-input request, against transformers' greedy Moshi on the same tiny checkpoint."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import omnictl
from omnictl.outputs import AudioChunk, AudioResult, TextResult
from omnictl.profiling.spans import build_trace
from omnictl.profiling.store import TraceStore
from omnictl.request import RequestEventKind, RequestState
from omnictl.topology.validation import loads
from tests.support.held import held_by

from .conftest import greedy_mismatches, speechlike, user_codes

# Two processes, a model load each, and 8 s of input at real time: about half a minute here.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "moshi.yaml"
# 100 frames: every one streamed back while the input streams at real time. (Mimi's attention
# window, 250 frames, is slid past by tests/models/mimi/test_streaming.py on the same
# StreamEncoder and StreamDecoder the codec stages run; the temporal transformer's is 3,000.)
SECONDS = 8.0
RATE = 24_000
CHUNK = 2_400  # 100 ms a chunk, as a microphone sends: not a whole frame (1,920), so frames straddle chunks
GREEDY = {"sampling": {"temperature": 0}}


def with_frames_terminal() -> Any:
    """The shipped topology, plus a terminal with the depth stage's result (every frame's codes
    and text token; the client sees audio and words otherwise): compared frame by frame."""
    text = TOPOLOGY.read_text()
    old = "    next: [mimi_decoder, text]\n"
    assert old in text
    text = text.replace(old, "    next: [mimi_decoder, text, frames]\n")
    text += (
        "\n  - name: frames\n    factory: omnictl.models.examples.identity\n    process: moshi\n"
        "    terminal: true\n    modality: codes\n"
    )
    return loads(text, str(TOPOLOGY))


async def _stream(request: Any, audio: np.ndarray, *, seconds_per_chunk: float, sent: list[float]) -> None:
    """Send ``audio`` in 100 ms chunks, each when it would have been recorded (0: at once), then end it."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index, at in enumerate(range(0, len(audio), CHUNK)):
        await asyncio.sleep(max(0.0, start + (index + 1) * seconds_per_chunk - loop.time()))
        await request.send(AudioChunk(samples=audio[at : at + CHUNK], sample_rate=RATE))
        sent.append(loop.time())
    await request.end_input()


def decoded(tokenizer: Any, tokens: list[int]) -> str:
    return str(tokenizer.decode(tokens, skip_special_tokens=True))


def test_a_session_streamed_at_real_time_is_transformers_greedy_moshi(
    tiny_moshi: Path, moshi_model: Any, tmp_path: Path
) -> None:
    audio = speechlike(SECONDS, seed=2)
    run_dir = tmp_path / "run"

    async def run() -> dict[str, Any]:
        async with omnictl.Pipeline.launch(
            with_frames_terminal(),
            model_path=str(tiny_moshi),
            device="cpu",
            run_dir=run_dir,
            profile=True,
            request_timeout=300,
        ) as pipe:
            request = await pipe.submit(GREEDY, input_stream=True)
            sent: list[float] = []
            feeder = asyncio.create_task(_stream(request, audio, seconds_per_chunk=CHUNK / RATE, sent=sent))
            chunks, arrived, during = [], [], 0
            async for event in request.events():
                if event.kind is RequestEventKind.STREAM and event.stage == "mimi_decoder":
                    chunks.append(event.data)
                    arrived.append(time.monotonic())
                    during += not feeder.done() and request.state is RequestState.RUNNING
            await feeder
            result = await request.result()
            # A second session, aborted (its client gone) once Moshi has started answering.
            aborted = await pipe.submit(GREEDY, input_stream=True)
            dropped = asyncio.create_task(_stream(aborted, audio[: RATE * 5], seconds_per_chunk=0.02, sent=[]))
            async for event in aborted.events():
                if event.kind is RequestEventKind.STREAM:
                    await pipe.abort(aborted.id)
                    break
            with pytest.raises(omnictl.RequestAborted):
                await dropped  # its next send is refused by name
            return {"id": request.id, "result": result, "chunks": chunks, "during": during, "held": await held_by(pipe)}

    got = asyncio.run(run())
    frames = int(SECONDS * 12.5)  # 100: one per whole 80 ms of input
    result = got["result"]
    # Every frame, in order, each 80 ms of audio, streamed while the input still was (how many
    # depends on the machine's load: the benchmark measures the latency, not this test).
    assert len(got["chunks"]) == frames
    assert all(isinstance(c, AudioChunk) and c.samples.size == 1920 for c in got["chunks"])
    assert got["during"] > 0, "no frame came back while the input was still streaming"
    made = result["frames"]
    assert made["codes"].shape == (frames, 8) and len(made["text_tokens"]) == frames
    # Text tokens and audio codes: transformers' greedy Moshi on the same user audio, frame by frame.
    model = moshi_model
    user = user_codes(model, audio)
    assert user.shape[0] == frames
    assert greedy_mismatches(model, user, made) == []
    # The waveform: transformers' Mimi decode of those frames, streamed a frame at a time.
    audio_out = result["mimi_decoder"]
    assert isinstance(audio_out, AudioResult) and audio_out.sample_rate == RATE
    with torch.inference_mode():
        reference = model.audio_encoder.decode(torch.as_tensor(made["codes"]).T[None]).audio_values.reshape(-1)
    np.testing.assert_allclose(audio_out.samples, reference.numpy(), atol=1e-4)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in got["chunks"]]), audio_out.samples)
    # The words: what the tokenizer makes of the session's text tokens (the depth stage's
    # decode), less a last character whose bytes had not all come when the session ended
    # (the text terminal streams whole characters only).
    tokenizer = AutoTokenizer.from_pretrained(tiny_moshi)
    tokens = made["text_tokens"]
    whole = max(n for n in range(len(tokens) + 1) if not decoded(tokenizer, tokens[:n]).endswith("\ufffd"))
    assert made["text"] == decoded(tokenizer, tokens)
    text = result["text"]
    assert isinstance(text, TextResult) and text.text == decoded(tokenizer, tokens[:whole])
    # The aborted session left nothing anywhere; the finished one's trace shows every stage.
    assert got["held"] == []
    trace = build_trace(got["id"], TraceStore(run_dir).events(got["id"]))
    assert trace.status == "completed"
    assert set(trace.stages) >= {"mimi_encoder", "temporal", "depth", "mimi_decoder", "text"}
