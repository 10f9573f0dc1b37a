"""The text terminal (``decode``): passes the thinker's text deltas to the client as they come.

Streams :class:`~omnictl.outputs.TextDelta` and returns :class:`~omnictl.outputs.TextResult`
(the text terminal contract).
"""

from __future__ import annotations

from omnictl.models.voice_assistant.text_stream import FollowedText, TextStreamFollower
from omnictl.outputs import TextDelta, TextResult
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import OutgoingKind, OutgoingMessage


class TextTerminalScheduler(TextStreamFollower):
    def on_text(self, request_id: str, state: FollowedText, delta: str) -> None:
        if not state.emitted:
            state.emitted = True
            self.profile(EventKind.FIRST_EMIT, request_id)
        self.emit(OutgoingMessage(OutgoingKind.STREAM, request_id, TextDelta(text=delta)))

    def on_complete(self, request_id: str, state: FollowedText, result: TextResult) -> None:
        # the upstream's text is the truth, even if a detokenizer rewrote a streamed delta
        self.emit(OutgoingMessage(OutgoingKind.RESULT, request_id, result.plain()))
