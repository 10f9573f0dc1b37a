"""Moshi's temporal and depth stages (their schedulers, in this process, wired by hand as the
topology wires them): a session's frames, its end, an abort that drops everything."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from omnictl.models.moshi.stages import depth, temporal
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage

from .conftest import speechlike, user_codes
from .test_model import session

GREEDY = {"sampling": {"temperature": 0}}


@pytest.fixture(scope="module")
def user(moshi_model: Any) -> torch.Tensor:
    return user_codes(moshi_model, speechlike(1.6, seed=3))  # 20 frames


async def _wired(tiny_moshi: Path) -> tuple[Any, Any, list[OutgoingMessage]]:
    """temporal -> depth as the topology wires them (stream chunks, then the result); depth's outputs collected."""
    first, second = temporal(tiny_moshi, depth="depth"), depth(tiny_moshi, temporal="temporal")
    first.stage_name, second.stage_name = "temporal", "depth"
    out: list[OutgoingMessage] = []

    def to_depth(message: OutgoingMessage) -> None:
        kind = IncomingKind.STREAM_CHUNK if message.kind is OutgoingKind.STREAM else IncomingKind.NEW_REQUEST
        if message.kind is OutgoingKind.ERROR:
            out.append(message)
            return
        second.inbox.put_nowait(IncomingMessage(kind, message.request_id, message.data, "temporal", GREEDY))

    first.deliver, second.deliver = to_depth, out.append
    await first.start()
    await second.start()
    return first, second, out


def _user_frames(rid: str, frames: torch.Tensor) -> list[IncomingMessage]:
    chunks = [
        IncomingMessage(IncomingKind.STREAM_CHUNK, rid, {"codes": f[None]}, "mimi_encoder", GREEDY) for f in frames
    ]
    return [*chunks, IncomingMessage(IncomingKind.NEW_REQUEST, rid, {"dropped_samples": 0}, "mimi_encoder", GREEDY)]


async def _until(condition: Any, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_session_through_the_two_stages_is_the_stepped_session(tiny_moshi: Path, user: torch.Tensor) -> None:
    async def run() -> list[OutgoingMessage]:
        first, second, out = await _wired(tiny_moshi)
        try:
            for message in _user_frames("s", user):
                first.inbox.put_nowait(message)
            await _until(lambda: any(m.kind is not OutgoingKind.STREAM for m in out))
            assert first.load().running == 0 and second.load().running == 0
            return out
        finally:
            await first.stop()
            await second.stop()

    out = asyncio.run(run())
    assert [m.kind for m in out] == [OutgoingKind.STREAM] * 20 + [OutgoingKind.RESULT]
    expected = session(tiny_moshi, user)
    result = out[-1].data
    assert torch.equal(result["codes"], expected["codes"]) and result["text_tokens"] == expected["text_tokens"]
    assert torch.equal(torch.cat([m.data["codes"] for m in out[:-1]]), expected["codes"])  # frame by frame, in order
    assert result["in_flight"]["token"] == expected["in_flight"]["token"]
    assert "".join(m.data["text"] for m in out[:-1]) == result["text"]


def test_an_abort_mid_session_drops_its_state_and_its_late_messages(tiny_moshi: Path, user: torch.Tensor) -> None:
    async def run() -> tuple[int, int, list[OutgoingMessage]]:
        first, second, out = await _wired(tiny_moshi)
        try:
            frames = _user_frames("s", user)
            for message in frames[:10]:
                first.inbox.put_nowait(message)
            await _until(lambda: len(out) >= 3)
            first.abort("s")
            second.abort("s")
            seen = len(out)
            for message in frames[10:]:  # late: ignored
                first.inbox.put_nowait(message)
            await _until(lambda: first.jobs() == 0 and second.jobs() == 0)
            return first.load().running + second.load().running, seen, out
        finally:
            await first.stop()
            await second.stop()

    running, seen, out = asyncio.run(run())
    assert running == 0
    assert all(m.kind is OutgoingKind.STREAM for m in out) and len(out) <= seen + 1  # at most the frame in flight
