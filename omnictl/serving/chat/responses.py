"""Pipeline events → OpenAI ``chat.completion`` objects and ``chat.completion.chunk`` deltas.

Terminals follow the output contract of :mod:`omnictl.outputs` (a stage checks its own
outputs against its modality, so what reaches this module is already typed): text
terminals stream :class:`TextDelta` and return :class:`TextResult`; audio terminals stream
:class:`AudioChunk` and return :class:`AudioResult`. Outputs of other modalities have no
place in a chat completion and are left out. A terminal that never streamed has its
result sent as a single delta, so a client always receives everything it asked for.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from omnictl.outputs import AudioChunk, FinishReason, TextDelta, TextResult, transcript_delta
from omnictl.serving.speech.encode import AudioStreamEncoder, b64, encode_whole

AUDIO_TTL_S = 3600


def logprobs_of(result: TextResult) -> dict[str, Any] | None:
    """A choice's ``logprobs`` in OpenAI's shape, when the request asked for them."""
    if result.logprobs is None:
        return None
    content = [
        {
            "token": item.token,
            "logprob": item.logprob,
            "bytes": item.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in item.top_logprobs],
        }
        for item in result.logprobs
    ]
    return {"content": content, "refusal": None}


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def take(self, result: TextResult) -> FinishReason:
        self.prompt_tokens = result.prompt_tokens
        self.completion_tokens = result.completion_tokens
        return result.finish_reason


@dataclass
class ChunkTranslator:
    """Turns one request's pipeline events into streamed chunk objects, in order."""

    request_id: str
    model: str
    audio_format: str
    created: int = field(default_factory=lambda: int(time.time()))
    audio_id: str = field(default_factory=lambda: f"audio_{secrets.token_hex(12)}")
    usage: Usage = field(default_factory=Usage)
    finish_reason: FinishReason = FinishReason.STOP
    streamed: set[str] = field(default_factory=set)  # terminals that sent at least one chunk
    # The text's logprobs, when asked for: stages stream text deltas only, so they come
    # whole with the result, in the last chunk (a client joins each chunk's content list).
    logprobs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.encoder = AudioStreamEncoder(self.audio_format)
        self.audio_sent = False
        self._spoken = ""  # the audio transcripts sent so far, joined

    def tail(self) -> list[dict[str, Any]]:
        """What a compressed audio stream's encoder still held (its last frames), as one
        more audio delta: the deltas' bytes joined are then one complete file."""
        if not self.audio_sent:
            return []
        data = self.encoder.finish()
        if not data:
            return []
        return [
            self._chunk(
                {
                    "audio": {
                        "id": self.audio_id,
                        "data": b64(data),
                        "transcript": "",
                        "expires_at": self.created + AUDIO_TTL_S,
                    }
                }
            )
        ]

    def _chunk(self, delta: dict[str, Any], finish_reason: FinishReason | None = None) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": None if finish_reason is None else finish_reason.value}
            ],
        }

    def first(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""})

    def _delta(self, data: object) -> list[dict[str, Any]]:
        if isinstance(data, (TextDelta, TextResult)):
            return [self._chunk({"content": data.text})] if data.text else []
        if isinstance(data, AudioChunk):  # an AudioResult too
            self.audio_sent = True
            words = transcript_delta(self._spoken, data.transcript)  # a client joins the deltas
            self._spoken += words
            audio = {
                "id": self.audio_id,
                "data": b64(self.encoder.encode(data.samples, data.sample_rate)),
                "transcript": words,
                "expires_at": self.created + AUDIO_TTL_S,
            }
            return [self._chunk({"audio": audio})]
        return []  # a free-form modality: nothing a chat completion can carry

    def on_stream(self, stage: str, data: object) -> list[dict[str, Any]]:
        self.streamed.add(stage)
        return self._delta(data)

    def on_result(self, stage: str, data: object) -> list[dict[str, Any]]:
        if isinstance(data, TextResult):
            self.finish_reason = self.usage.take(data)
            self.logprobs = logprobs_of(data)
        return [] if stage in self.streamed else self._delta(data)

    def last(self) -> dict[str, Any]:
        chunk = self._chunk({}, self.finish_reason)
        if self.logprobs is not None:
            chunk["choices"][0]["logprobs"] = self.logprobs
        chunk["usage"] = self.usage.as_dict()
        return chunk


def build_completion(request_id: str, model: str, results: Mapping[str, object], audio_format: str) -> dict[str, Any]:
    """The non-streamed response from ``{terminal: result}``."""
    created = int(time.time())
    usage = Usage()
    finish_reason = FinishReason.STOP
    message: dict[str, Any] = {"role": "assistant", "content": None}
    choice: dict[str, Any] = {"index": 0, "message": message}
    for data in results.values():
        if isinstance(data, TextResult):
            finish_reason = usage.take(data)
            message["content"] = data.text
            logprobs = logprobs_of(data)
            if logprobs is not None:
                choice["logprobs"] = logprobs
        elif isinstance(data, AudioChunk):
            message["audio"] = {
                "id": f"audio_{secrets.token_hex(12)}",
                "data": b64(encode_whole(data.samples, data.sample_rate, audio_format)),
                "transcript": data.transcript,
                "expires_at": created + AUDIO_TTL_S,
            }
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{**choice, "finish_reason": finish_reason.value}],
        "usage": usage.as_dict(),
    }
