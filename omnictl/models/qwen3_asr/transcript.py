"""``transcript``: the terminal. The decoder's tokens as a :class:`~omnictl.outputs.Transcript`.

Qwen3-ASR answers ``language English<asr_text>the words`` when it names the language
itself, and only the words when the prompt forced one. While streaming, the header is
held back until ``<asr_text>`` arrives (or until the text can no longer be one), and each
new piece of the words leaves as a Transcript holding that one segment, as
``/v1/audio/transcriptions`` streams them. The result is transformers' own reading of the
whole answer (``Qwen3ASRProcessor.parse_output``: the language, the words, its repetition
fix) with:

- streamed requests (``stream=true``): the streamed pieces as its segments, plus what the
  last tokens added (the result may overtake the last chunks; the route sends those it has
  not sent);
- the others: one segment spanning the clip (Qwen3-ASR gives no timestamps of its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnictl.models.qwen3_asr.decoder import AsrDelta, AsrResult
from omnictl.models.qwen3_asr.frontend import NAME_TO_CODE
from omnictl.models.qwen3_asr.weights import load_processor
from omnictl.outputs import TokenDelta, TokenResult, Transcript, TranscriptSegment
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)

MARKER = "<asr_text>"
HEADER = "language "


def words_so_far(text: str, forced: bool) -> str | None:
    """The words in a partial answer, or None while it may still be the language header."""
    if forced:
        return text.lstrip()
    if MARKER in text:
        return text.split(MARKER, 1)[1].lstrip()
    stripped = text.lstrip()
    if HEADER.startswith(stripped) or stripped.startswith(HEADER):
        return None
    return stripped


class _Stream:
    """One request's tokens and what of them has streamed."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.piece_tokens: list[list[int]] = []  # the tokens that brought each piece
        self.facts: dict[str, Any] = {}

    @property
    def sent(self) -> str:
        return "".join(self.pieces)


class TranscriptScheduler(Scheduler):
    def __init__(self, model_path: str | Path | None) -> None:
        super().__init__()
        self.processor = load_processor(model_path)
        self._streams: dict[str, _Stream] = {}
        self._finished = RecentIds()  # done or aborted: chunks that come later are dropped

    async def run(self) -> None:
        while True:
            self._handle(await self.inbox.get())

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._finished:
            return
        if message.kind is IncomingKind.STREAM_CHUNK:
            if not isinstance(message.data, TokenDelta):
                self._refuse(rid, f"expected the decoder's TokenDelta chunks, got {type(message.data).__name__}")
                return
            stream = self._streams.setdefault(rid, _Stream())
            if isinstance(message.data, AsrDelta) and message.data.request:
                stream.facts = dict(message.data.request)
            stream.tokens.extend(int(t) for t in message.data.token_ids)
            piece = self._new_words(stream)
            if piece:
                tokens = stream.tokens[sum(map(len, stream.piece_tokens)) :]
                stream.pieces.append(piece)
                stream.piece_tokens.append(tokens)
                segment = self._segment(len(stream.pieces) - 1, piece, stream.facts, tokens)
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, Transcript(text=piece, segments=[segment])))
        elif message.kind is IncomingKind.NEW_REQUEST:
            data = message.data
            if not isinstance(data, TokenResult):
                self._refuse(rid, f"expected the decoder's TokenResult, got {type(data).__name__}")
                return
            self._finished.add(rid)
            held = self._streams.pop(rid, None)
            stream = held if held is not None else _Stream()
            if isinstance(data, AsrResult) and data.request:
                stream.facts = dict(data.request)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, self._result(data, stream)))

    def _text(self, tokens: list[int]) -> str:
        return str(self.processor.decode(tokens, skip_special_tokens=True))

    def _new_words(self, stream: _Stream) -> str:
        words = words_so_far(self._text(stream.tokens).rstrip("\ufffd"), forced=bool(stream.facts.get("language")))
        sent = stream.sent
        if words is None or not words.startswith(sent):
            return ""  # a header, or a character whose bytes are not all in yet
        return words[len(sent) :]

    def _segment(self, index: int, text: str, facts: dict[str, Any], tokens: list[int]) -> TranscriptSegment:
        end = float(facts.get("duration") or 0.0)
        return TranscriptSegment(id=index, start=0.0, end=end, text=text, tokens=tokens)

    def _result(self, data: TokenResult, stream: _Stream) -> Transcript:
        ids = [int(t) for t in data.token_ids]
        parsed = self.processor.parse_output(self._text(ids))
        text = str(parsed["transcription"])
        facts = stream.facts
        language = facts.get("language") or _code(parsed["language"])
        if facts.get("stream"):
            pieces, tokens = list(stream.pieces), list(stream.piece_tokens)
            sent = stream.sent
            if text.startswith(sent) and len(text) > len(sent):
                pieces.append(text[len(sent) :])
                tokens.append(ids[sum(map(len, tokens)) :])
            segments = [self._segment(i, piece, facts, t) for i, (piece, t) in enumerate(zip(pieces, tokens))]
        else:
            segments = [self._segment(0, text, facts, ids)] if text else []
        return Transcript(text=text, language=language, duration=float(facts.get("duration") or 0.0), segments=segments)

    def _refuse(self, rid: str, reason: str) -> None:
        self.abort(rid)
        self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}"))

    def abort(self, request_id: str) -> None:
        self._finished.add(request_id)
        self._streams.pop(request_id, None)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self._streams), stream_buffers=len(self._streams))


def _code(name: Any) -> str | None:
    """An ISO code for the language the model named (its name lowercased if it has none)."""
    if not isinstance(name, str) or not name or name.lower() == "none":
        return None
    return NAME_TO_CODE.get(name.lower(), name.lower())
