"""Replay: a SIGKILLed replica's requests that had shown their caller nothing re-run from the
entry on the other replica and complete with the right result; the one already streaming to
its caller fails naming its stage (resuming a stream is not implemented)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import omnictl
from omnictl.coordinator.request import RequestEventKind
from tests.support import topo
from tests.support.loop import LoopThread, launch

E = "omnictl.models.examples"
STREAMED = " ".join(f"w{i}" for i in range(40))  # 40 words, 25 ms each: a second of streaming


def two_replicas(tmp_path: Path) -> Path:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["speak"], "process": "front"},
        {"name": "speak", "factory": f"{E}.words", "factory_args": {"delay": 0.025}, "terminal": True,
         "process": "work"},
    ]
    return topo.write(tmp_path / "replay.yaml", stages, processes={"work": {"replicas": 2}})


async def _run(request: Any) -> tuple[str, Any]:
    """The request's streamed text, joined, and its result (or the failure)."""
    chunks: list[str] = []
    async for event in request.events():
        if event.kind is RequestEventKind.STREAM:
            chunks.append(event.data["text"])
    try:
        return "".join(chunks), (await request.result())["speak"]
    except omnictl.RequestFailed as failed:
        return "".join(chunks), failed


def test_a_killed_replica_s_queued_requests_complete_on_the_other_and_its_stream_fails_naming_the_stage(
    loop: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="omnictl.coordinator.coordinator")
    pipe = launch(loop, two_replicas(tmp_path), profile=False)
    try:
        victim = pipe.process_ids()["work#1"]

        async def kill_under_load() -> list[tuple[str, Any]]:
            streams = [await pipe.submit({"text": STREAMED, "i": i}) for i in range(5)]
            queued = [await pipe.submit({"text": f"short {i}", "i": 5 + i}) for i in range(20)]
            runs = [asyncio.ensure_future(_run(r)) for r in streams + queued]
            await asyncio.sleep(0.4)  # each replica streams its first request; the rest wait behind it
            os.kill(victim, signal.SIGKILL)
            return list(await asyncio.wait_for(asyncio.gather(*runs), 60))

        outcomes = loop.run(kill_under_load())
        failed = [(i, o) for i, (_, o) in enumerate(outcomes) if isinstance(o, omnictl.RequestFailed)]
        # Only the request the victim was streaming had shown its caller anything.
        assert len(failed) == 1, failed
        index, failure = failed[0]
        assert index < 5 and failure.stage == "speak"
        assert "replica 'work#1' (stages speak) died: killed by SIGKILL" in str(failure)
        assert str(failure).endswith("(not replayed: its caller already received output it cannot resume from)")
        for i, (text, result) in enumerate(outcomes):
            if i == index:
                continue
            expected = STREAMED if i < 5 else f"short {i - 5}"
            assert result == {"text": expected, "i": i}  # the right inputs, replayed or not
            assert text == expected + " "  # every word once, in order
        # one line per replay, naming the request and the stage that lost it
        replays = [r.getMessage() for r in caplog.records if "replayed from the entry" in r.getMessage()]
        assert len(replays) >= 5, replays  # the victim held about half of the 24 that waited
        assert all("stage 'speak' lost it: replica 'work#1'" in line for line in replays)
        assert loop.run(pipe.held())["coordinator"]["requests"] == 0
    finally:
        loop.run(pipe.close())


R = "tests.support.replica_stages"
ECHOED = "the quick brown fox jumps over the lazy dog, " * 4  # 180 bytes, 12 ms a token: about 2 s


def ar_two_replicas(tmp_path: Path) -> Path:
    stages = [
        {"name": "a", "factory": f"{E}.identity", "next": ["echo"], "process": "front"},
        {"name": "echo", "factory": f"{R}.slow_echo", "factory_args": {"delay": 0.012, "stream_every": 3},
         "terminal": True, "modality": "text", "process": "model"},
    ]
    return topo.write(tmp_path / "resume.yaml", stages, processes={"model": {"replicas": 2}})


def test_a_stream_cut_by_a_killed_replica_resumes_on_the_other_with_no_repeated_or_missing_words(
    loop: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="omnictl.coordinator.coordinator")
    pipe = launch(loop, ar_two_replicas(tmp_path), profile=False)
    try:
        async def cut() -> tuple[list[str], Any, list[str], Any]:
            request = await pipe.submit({"prompt": list(ECHOED.encode())})
            replica = f"model#{pipe._coordinator.placement._assigned[request.id]['model'].split('#')[1]}"
            chunks: list[str] = []
            killed_after: list[str] = []
            async for event in request.events():
                if event.kind is RequestEventKind.STREAM:
                    chunks.append(event.data.text)
                    if len(chunks) == 15 and not killed_after:  # mid-stream: 45 of 180 bytes sent
                        killed_after.append("".join(chunks))
                        os.kill(pipe.process_ids()[replica], signal.SIGKILL)
            return chunks, await request.result(), killed_after, replica

        chunks, result, killed_after, replica = loop.run(cut(), timeout=60)
        text = result["echo"]
        assert "".join(chunks) == ECHOED  # joined, the stream is the clean run's text: nothing twice, nothing lost
        assert text.text == ECHOED and text.token_ids == list(ECHOED.encode())
        assert text.completion_tokens == len(ECHOED.encode()) + 1  # the stop token counts; forced ones too
        assert len(killed_after[0]) >= 45 and ECHOED.startswith(killed_after[0])
        lines = [r.getMessage() for r in caplog.records if "resumed with the tokens its caller has forced" in r.getMessage()]
        assert len(lines) == 1 and f"replica '{replica}'" in lines[0] and "stage 'echo' lost it" in lines[0]
        assert (pipe.replayed, pipe.resumed) == (1, 1)
    finally:
        loop.run(pipe.close())
