"""Pipeline events → OpenAI ``chat.completion`` objects and ``chat.completion.chunk`` deltas.

Terminal conventions (see the runtime contract): a text terminal streams
``{"text": delta}`` and returns ``{"text", "prompt_tokens", "completion_tokens",
"finish_reason"}``; an audio terminal streams ``{"audio", "sample_rate", "transcript"}``
and returns the whole waveform the same way. A terminal that never streamed has its
result sent as a single delta, so a client always receives everything it asked for.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from omnictl.serving.audio import AudioStreamEncoder, b64, encode_whole, to_float32

AUDIO_TTL_S = 3600


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


def _usage_from(result: Mapping[str, Any], usage: Usage) -> str:
    usage.prompt_tokens = int(result.get("prompt_tokens") or 0)
    usage.completion_tokens = int(result.get("completion_tokens") or 0)
    return str(result.get("finish_reason") or "stop")


@dataclass
class ChunkTranslator:
    """Turns one request's pipeline events into streamed chunk objects, in order."""

    request_id: str
    model: str
    produces: Mapping[str, str]  # terminal stage -> modality
    audio_format: str
    created: int = field(default_factory=lambda: int(time.time()))
    audio_id: str = field(default_factory=lambda: f"audio_{secrets.token_hex(12)}")
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    streamed: set[str] = field(default_factory=set)  # terminals that sent at least one chunk
    text_seen: bool = False
    audio_seen: bool = False

    def __post_init__(self) -> None:
        self.encoder = AudioStreamEncoder(self.audio_format)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def first(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""})

    def _text_delta(self, text: str) -> dict[str, Any]:
        self.text_seen = True
        return self._chunk({"content": text})

    def _audio_delta(self, data: Mapping[str, Any]) -> dict[str, Any]:
        self.audio_seen = True
        encoded = self.encoder.encode(data["audio"], int(data["sample_rate"]))
        audio = {
            "id": self.audio_id,
            "data": b64(encoded),
            "transcript": str(data.get("transcript") or ""),
            "expires_at": self.created + AUDIO_TTL_S,
        }
        return self._chunk({"audio": audio})

    def on_stream(self, stage: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.streamed.add(stage)
        if self.produces.get(stage) == "audio":
            return [self._audio_delta(data)]
        text = str(data.get("text") or "")
        return [self._text_delta(text)] if text else []

    def on_result(self, stage: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        modality = self.produces.get(stage)
        if modality == "text":
            self.finish_reason = _usage_from(data, self.usage)
        if stage in self.streamed:
            return []
        if modality == "audio":
            return [self._audio_delta(data)]
        text = str(data.get("text") or "")
        return [self._text_delta(text)] if text else []

    def last(self) -> dict[str, Any]:
        chunk = self._chunk({}, self.finish_reason)
        chunk["usage"] = self.usage.as_dict()
        return chunk


def build_completion(
    request_id: str,
    model: str,
    produces: Mapping[str, str],
    results: Mapping[str, Mapping[str, Any]],
    audio_format: str,
) -> dict[str, Any]:
    """The non-streamed response from ``{terminal: result}``."""
    created = int(time.time())
    usage = Usage()
    finish_reason = "stop"
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for stage, data in results.items():
        modality = produces.get(stage)
        if modality == "text":
            finish_reason = _usage_from(data, usage)
            message["content"] = str(data.get("text") or "")
        elif modality == "audio":
            rate = int(data["sample_rate"])
            samples = to_float32(data["audio"], f"stage {stage!r} result")
            message["audio"] = {
                "id": f"audio_{secrets.token_hex(12)}",
                "data": b64(encode_whole(samples, rate, audio_format)),
                "transcript": str(data.get("transcript") or ""),
                "expires_at": created + AUDIO_TTL_S,
            }
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage.as_dict(),
    }
