"""End to end: the AR scheduler consults ``audio_policy``. With one slot per round, under
``fifo`` a second stream waits for the first to finish; under ``deadline`` the first,
seconds ahead of its listener, gives its slot to the new stream, whose first chunk is due
sooner, and both finish with the tokens they have alone (real processes, ZeroMQ, the
tiny real Llama slowed on purpose)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

import omnictl

TOPOLOGY = {
    "name": "slow-talker",
    "stages": [
        {"name": "talker", "factory": "tests.schedulers.ar_audio_stages.slow_talker", "terminal": True,
         "modality": "text", "process": "talker"},
    ],
}


async def two_streams(path: Path, policy: str) -> tuple[list[str], dict[str, str]]:
    """The order the two streams' tokens came in, and each one's text."""
    heard: list[str] = []
    texts: dict[str, str] = {}
    a_started = asyncio.Event()

    async def listen(request: omnictl.RequestHandle, name: str) -> None:
        async for event in request.events():
            assert event.kind != "error", event.error
            if event.kind == "stream":
                heard.extend([name] * len(event.data.token_ids))
                if heard.count("a") >= 5:
                    a_started.set()
            elif event.kind == "result":
                texts[name] = event.data.text

    async with omnictl.Pipeline.launch(path, profile=False, audio_policy=policy) as pipe:
        a = await pipe.submit({"input_ids": [5, 6, 7, 8]})
        listening = [asyncio.create_task(listen(a, "a"))]
        await asyncio.wait_for(a_started.wait(), 30)  # a is seconds of audio ahead of its listener
        b = await pipe.submit({"input_ids": [9, 10, 11]})
        listening.append(asyncio.create_task(listen(b, "b")))
        await asyncio.wait_for(asyncio.gather(*listening), 60)
    return heard, texts


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], dict[str, str]]]:
    path = tmp_path_factory.mktemp("ar-policy") / "slow-talker.yaml"
    path.write_text(yaml.safe_dump(TOPOLOGY))
    return {policy: asyncio.run(two_streams(path, policy)) for policy in ("fifo", "deadline")}


def test_under_fifo_the_new_stream_waits_for_the_whole_first(runs: dict[str, tuple[list[str], dict[str, str]]]) -> None:
    heard, _ = runs["fifo"]
    assert heard == ["a"] * 40 + ["b"] * 40


def test_under_deadline_the_new_stream_takes_the_slot_of_the_one_ahead(
    runs: dict[str, tuple[list[str], dict[str, str]]],
) -> None:
    heard, texts = runs["deadline"]
    first_b = heard.index("b")
    assert first_b < 20, heard  # a had about 5-10 s of audio in hand when b came: b went first
    assert heard.count("a") == 40 and heard.count("b") == 40
    # parked and resumed, each stream's tokens are those it has alone (greedy, same prompt)
    assert texts == runs["fifo"][1]
