"""The frame loop between CSM's backbone and its depth decoder, two stages of one process.

CSM makes a frame in two steps: the backbone (over frames) picks the frame's first
codebook, the depth decoder (over the frame's codebooks) the rest; and the backbone's
next step reads the whole frame. The topology draws the forward half (``backbone``
streams each first code and its hidden state to ``depth``, which streams finished frames
to the Mimi decoder: ``next`` + ``stream_to``); a topology is acyclic, so the way back
(each finished frame to the backbone) is this loop: the depth stage hands the frame to
the backbone's scheduler as a stream chunk of its own inbox, on the process's event loop,
exactly as a ``stream_to`` edge would deliver it. Both stages must share a process
(``process:`` in the topology); the depth stage says so by name when they do not.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from omnictl.schedulers.base import IncomingKind, IncomingMessage, Scheduler

_lock = threading.Lock()
_backbones: dict[str, tuple[Scheduler, asyncio.AbstractEventLoop]] = {}


def register(stage: str, scheduler: Scheduler, loop: asyncio.AbstractEventLoop) -> None:
    """The backbone ``stage``'s scheduler takes frames from now on (called at its start)."""
    with _lock:
        _backbones[stage] = (scheduler, loop)


def unregister(stage: str, scheduler: Scheduler) -> None:
    with _lock:
        if _backbones.get(stage, (None,))[0] is scheduler:
            del _backbones[stage]


def send_back(stage: str, request_id: str, frame: Any, *, source: str | None) -> None:
    """Give ``frame`` to the backbone ``stage`` of this process (callable from any thread)."""
    with _lock:
        found = _backbones.get(stage)
    if found is None:
        raise RuntimeError(
            f"no CSM backbone stage {stage!r} runs in this process: the depth decoder must share the backbone's "
            "`process:` in the topology (it hands every frame back to it)"
        )
    scheduler, loop = found
    message = IncomingMessage(IncomingKind.STREAM_CHUNK, request_id, data=frame, source=source)
    loop.call_soon_threadsafe(scheduler.inbox.put_nowait, message)
