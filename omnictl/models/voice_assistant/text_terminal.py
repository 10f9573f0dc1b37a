"""The text terminal (``decode``): passes the thinker's text deltas to the client as they come.

Stream chunks ``{"text": delta}``; result ``{"text", "prompt_tokens", "completion_tokens",
"finish_reason"}`` (the terminal convention the HTTP layer relies on).
"""

from __future__ import annotations

from typing import Any, Mapping

from omnictl.models.voice_assistant.text_stream import FollowedText, TextStreamFollower
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import OutgoingKind, OutgoingMessage


class TextTerminalScheduler(TextStreamFollower):
    def on_text(self, request_id: str, state: FollowedText, delta: str) -> None:
        if not state.emitted:
            state.emitted = True
            self.profile(EventKind.FIRST_EMIT, request_id)
        self.emit(OutgoingMessage(OutgoingKind.STREAM, request_id, {"text": delta}))

    def on_complete(self, request_id: str, state: FollowedText, result: Mapping[str, Any]) -> None:
        self.emit(
            OutgoingMessage(
                OutgoingKind.RESULT,
                request_id,
                {
                    "text": str(result["text"]),  # the truth, even if a detokenizer rewrote a streamed delta
                    "prompt_tokens": int(result.get("prompt_tokens", 0)),
                    "completion_tokens": int(result.get("completion_tokens", 0)),
                    "finish_reason": str(result.get("finish_reason") or "stop"),
                },
            )
        )
