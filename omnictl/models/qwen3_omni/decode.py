"""``decode``: the text terminal. Detokenizes the thinker's stream into text deltas."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from omnictl.models.qwen3_omni.weights import check_model_path
from omnictl.outputs import TextDelta, TextResult, TokenDelta, TokenResult
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from omnictl.schedulers.sampling import cut_at_stop, streamable_prefix


class DecodeScheduler(Scheduler):
    """Streams a :class:`TextDelta` per thinker chunk; the :class:`TextResult` is the whole text and counts."""

    def __init__(self, model_path: str | Path | None) -> None:
        super().__init__()
        # The tokenizer alone (Qwen2.5-Omni's decode stage is this one too).
        self.tokenizer = AutoTokenizer.from_pretrained(check_model_path(model_path), local_files_only=True)
        self._tokens: dict[str, list[int]] = {}
        self._sent: dict[str, str] = {}

    async def run(self) -> None:
        while True:
            self._handle(await self.inbox.get())

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        stop = tuple((message.params.get("sampling") or {}).get("stop") or ())
        if isinstance(stop, str):
            stop = (stop,)
        if message.kind is IncomingKind.STREAM_CHUNK:
            if not isinstance(message.data, TokenDelta):
                self._refuse(rid, f"expected the thinker's TokenDelta chunks, got {type(message.data).__name__}")
                return
            tokens = self._tokens.setdefault(rid, [])
            tokens.extend(int(t) for t in message.data.token_ids)
            text = streamable_prefix(self._text(tokens), stop)
            sent = self._sent.get(rid, "")
            if text.startswith(sent) and len(text) > len(sent):
                self._sent[rid] = text
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, TextDelta(text=text[len(sent) :])))
        elif message.kind is IncomingKind.NEW_REQUEST:
            data = message.data
            if not isinstance(data, TokenResult):
                self._refuse(rid, f"expected the thinker's TokenResult, got {type(data).__name__}")
                return
            text, _ = cut_at_stop(self._text([int(t) for t in data.token_ids]), stop)
            sent = self._sent.pop(rid, "")
            self._tokens.pop(rid, None)
            if text.startswith(sent) and len(text) > len(sent):
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, TextDelta(text=text[len(sent) :])))
            result = TextResult(
                text=text,
                finish_reason=data.finish_reason,
                prompt_tokens=data.prompt_tokens,
                completion_tokens=data.completion_tokens,
                logprobs=data.logprobs,  # when the request asked the thinker for them
            )
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def _refuse(self, rid: str, reason: str) -> None:
        self.abort(rid)
        self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}"))

    def _text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def abort(self, request_id: str) -> None:
        self._tokens.pop(request_id, None)
        self._sent.pop(request_id, None)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self._tokens), stream_buffers=len(self._tokens))
