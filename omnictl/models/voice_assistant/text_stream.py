"""A scheduler base for stages that follow an upstream's streamed text (decode, TTS).

The upstream (the thinker) streams :class:`~omnictl.outputs.TextDelta` chunks to this stage
and also sends it its final :class:`~omnictl.outputs.TextResult` through ``next``. Chunks and the
result travel on different channels, so the result may overtake the last chunks: the
result's text is the truth, and whatever it holds beyond what was streamed is handed
on as one last delta. A request is done here when its result arrives; chunks that
arrive later are ignored (a bounded memory of finished ids keeps them from starting
a new request).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping

from omnictl.outputs import TextDelta, TextResult
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)


@dataclass(slots=True)
class FollowedText:
    """What this stage knows about one request so far."""

    params: Mapping[str, Any]
    streamed: str = ""
    emitted: bool = False  # whether FIRST_EMIT was recorded
    extra: dict[str, Any] = field(default_factory=dict)


class TextStreamFollower(Scheduler):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, FollowedText] = {}
        self._finished = RecentIds()  # done or aborted here: late chunks must not start them again

    async def run(self) -> None:
        while True:
            self.accept(await self.inbox.get())  # no local: an idle loop keeps no input alive

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._finished:
            return
        state = self.requests.get(rid)
        if state is None:
            state = self.requests[rid] = FollowedText(params=message.params)
        if message.kind is IncomingKind.STREAM_CHUNK:
            if not isinstance(message.data, TextDelta):
                self.fail(rid, f"expected TextDelta stream chunks, got {_describe(message.data)}")
            elif message.data.text:
                state.streamed += message.data.text
                self.on_text(rid, state, message.data.text)
        elif message.kind is IncomingKind.STREAM_DONE:
            self.on_stream_done(rid, state)
        elif message.kind is IncomingKind.NEW_REQUEST:
            if not isinstance(message.data, TextResult):
                self.fail(rid, f"expected the upstream's result to be a TextResult, got {_describe(message.data)}")
                return
            full = message.data.text
            if full.startswith(state.streamed) and len(full) > len(state.streamed):
                rest = full[len(state.streamed) :]
                state.streamed = full
                self.on_text(rid, state, rest)
            self.forget(rid)
            self.on_complete(rid, state, message.data)

    def abort(self, request_id: str) -> None:
        self.forget(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self.requests), stream_buffers=len(self.requests))

    def forget(self, request_id: str) -> None:
        """Drop the request's state; later messages for it are ignored."""
        self.requests.pop(request_id, None)
        self._finished.add(request_id)

    def fail(self, request_id: str, reason: str, field: str | None = None) -> None:
        self.forget(request_id)
        self.emit(
            OutgoingMessage(OutgoingKind.ERROR, request_id, error=f"stage {self.stage_name}: {reason}", field=field)
        )

    @abstractmethod
    def on_text(self, request_id: str, state: FollowedText, delta: str) -> None:
        """New text for the request, in order."""

    def on_stream_done(self, request_id: str, state: FollowedText) -> None:
        """The upstream finished streaming (its result may still be on its way)."""

    @abstractmethod
    def on_complete(self, request_id: str, state: FollowedText, result: TextResult) -> None:
        """The upstream's result arrived; every delta has been passed to :meth:`on_text`."""


def _describe(data: Any) -> str:
    if isinstance(data, Mapping):
        return f"a dict with keys {sorted(map(str, data))}"
    return type(data).__name__
