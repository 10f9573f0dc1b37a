"""End to end: ``audio_policy`` reaches the stage processes, and under ``deadline`` a new
stream's first sentence is spoken before the queued sentences of one with seconds of
audio in hand (real processes, ZeroMQ; the speaker slowed on purpose)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

import omnictl

TOPOLOGY = {
    "name": "slow-speech",
    "stages": [
        {"name": "words", "factory": "tests.playback.slow_stages.words", "next": ["tts"], "stream_to": ["tts"],
         "process": "text"},
        {"name": "tts", "factory": "tests.playback.slow_stages.slow_tts", "terminal": True, "modality": "audio",
         "process": "speech"},
    ],
}


async def spoken_order(path: Path, policy: str) -> list[str]:
    heard: list[tuple[float, str]] = []

    async def listen(request: omnictl.RequestHandle, name: str) -> None:
        async for event in request.events():
            if event.kind == "stream" and event.stage == "tts":
                heard.append((time.perf_counter(), f"{name}:{event.data.transcript}"))
            assert event.kind != "error", event.error

    async with omnictl.Pipeline.launch(path, profile=False, audio_policy=policy) as pipe:
        a = await pipe.submit({"text": "One. Two. Three. Four."})
        listening = [asyncio.create_task(listen(a, "a"))]
        await asyncio.sleep(0.15)  # a's first sentence is being spoken
        b = await pipe.submit({"text": "Hello there."})
        listening.append(asyncio.create_task(listen(b, "b")))
        await asyncio.wait_for(asyncio.gather(*listening), 30)
    return [what for _, what in sorted(heard)]


@pytest.mark.parametrize(("policy", "order"), [
    # fifo: a stream's first clause goes ahead of other streams' later sentences (a new turn's
    # first audio waits for nobody's answer), then first come, first served; so here it orders
    # as the deadline policy does (tests/models/voice_assistant/test_speech_scheduler.py tells
    # the two apart on later sentences)
    ("fifo", ["a:One.", "b:Hello there.", "a:Two.", "a:Three.", "a:Four."]),
    ("deadline", ["a:One.", "b:Hello there.", "a:Two.", "a:Three.", "a:Four."]),
])
def test_the_policy_orders_the_sentences_of_two_streams(tmp_path: Path, policy: str, order: list[str]) -> None:
    path = tmp_path / "slow-speech.yaml"
    path.write_text(yaml.safe_dump(TOPOLOGY))
    assert asyncio.run(spoken_order(path, policy)) == order
