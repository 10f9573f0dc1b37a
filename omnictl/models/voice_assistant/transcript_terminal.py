"""The ``transcript`` terminal: hands on what ``asr`` heard, and the segments it streams.

``asr`` streams each decoded segment of a streamed transcription here (a
:class:`~omnictl.outputs.Transcript` holding that one segment) and then sends its data,
whose ``transcript`` is the result. Chunks and the result travel on different channels,
so the result may overtake the last chunks; it holds every segment, so the HTTP layer
hands on whatever was not streamed. Chunks that arrive after the result are ignored.
Nothing is held per request but the bounded memory of finished ids.
"""

from __future__ import annotations

from typing import Any, Mapping

from omnictl.outputs import Transcript
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)


class TranscriptTerminalScheduler(Scheduler):
    def __init__(self) -> None:
        super().__init__()
        self._finished = RecentIds()  # done or aborted: late chunks are dropped

    async def run(self) -> None:
        while True:
            self.accept(await self.inbox.get())

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._finished:
            return
        if message.kind is IncomingKind.STREAM_CHUNK:
            if isinstance(message.data, Transcript):
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, message.data))
            else:
                self._fail(rid, f"expected Transcript stream chunks, got {type(message.data).__name__}")
        elif message.kind is IncomingKind.NEW_REQUEST:
            self._finished.add(rid)
            data: Any = message.data
            heard = data.get("transcript") if isinstance(data, Mapping) else None
            if not isinstance(heard, Transcript):
                self._fail(rid, f"expected asr's data with a 'transcript', got {type(data).__name__}")
                return
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, heard))

    def _fail(self, rid: str, reason: str) -> None:
        self._finished.add(rid)
        self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}"))

    def abort(self, request_id: str) -> None:
        self._finished.add(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad()
