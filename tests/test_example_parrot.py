"""The guide's example model (examples/parrot) runs through the Python API and the HTTP
server, and emits the typed outputs of its terminals."""

from __future__ import annotations

import asyncio
import base64
import io
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

import omnictl
from omnictl.outputs import AudioResult, FinishReason, TextDelta, TextResult
from tests.serving.harness import start_server, stop_server

# Longer than the suite's default deadline: the parrot example served over HTTP, up to ~15 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

TOPOLOGY = Path(__file__).resolve().parents[1] / "examples" / "parrot" / "topology.yaml"


def test_parrot_repeats_the_question_as_streamed_text_and_one_beep_per_word() -> None:
    async def go() -> tuple[list[str], dict[str, object]]:
        async with omnictl.Pipeline.launch(TOPOLOGY, profile=False) as pipe:
            request = await pipe.submit({"messages": [{"role": "user", "content": "polly wants a cracker"}]})
            deltas = [e.data.text async for e in request.events() if e.kind is omnictl.RequestEventKind.STREAM and isinstance(e.data, TextDelta)]
            return deltas, await request.result()

    deltas, results = asyncio.run(go())
    text, audio = results["show"], results["speak"]
    assert isinstance(text, TextResult) and text.text == "polly wants a cracker"
    assert "".join(deltas) == text.text and len(deltas) > 1  # it streamed
    assert text.finish_reason is FinishReason.STOP and text.prompt_tokens == len("polly wants a cracker")
    assert isinstance(audio, AudioResult) and audio.transcript == "polly wants a cracker"
    assert audio.samples.size == int(len("pollywantsacracker") * 0.02 * 16_000)


def test_parrot_served_over_http_answers_a_spoken_question_in_text_and_wav() -> None:
    tone = (0.1 * np.sin(np.arange(8000) / 5)).astype(np.float32)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(2), wav.setframerate(16_000)
        wav.writeframes((tone * 32767).astype("<i2").tobytes())
    server = start_server(str(TOPOLOGY))
    try:
        content = [
            {"type": "text", "text": "what is this"},
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(buffer.getvalue()).decode(), "format": "wav"}},
        ]
        body = {"model": "parrot", "modalities": ["text", "audio"], "audio": {"format": "wav"},
                "messages": [{"role": "user", "content": content}]}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["content"] == "what is this (0.5 seconds of audio)"
        with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as wav:
            assert wav.getframerate() == 16_000 and wav.getnframes() > 0
        assert message["audio"]["transcript"] == "what is this (0.5 seconds of audio)"
    finally:
        assert stop_server(server) == 0, server.text()
