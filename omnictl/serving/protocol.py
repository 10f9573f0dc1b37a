"""The OpenAI chat-completions request envelope, checked field by field.

This module checks the HTTP envelope (types, ranges, which modalities and audio
formats this topology can produce). The message contents themselves are checked by
:func:`omnictl.models.inputs.parse_request` where that module exists, because the
model side owns what a message may contain.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from omnictl.exceptions import InvalidRequest

AUDIO_FORMATS = ("wav", "pcm16")
# OpenAI's own voice names. Clients such as the `openai` package insist on one of them,
# so they mean "this topology's default voice" rather than failing at the speech stage.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar"}
)
_ROLES = ("system", "developer", "user", "assistant", "tool")


from omnictl.exceptions import PayloadTooLarge


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024
    max_audio_bytes: int = 16 * 1024 * 1024  # decoded size of one input_audio part


@dataclass(frozen=True)
class ChatRequest:
    """What the HTTP layer needs from one chat-completions body."""

    model: str
    messages: list[dict[str, Any]]
    modalities: list[str]
    audio_format: str
    voice: str | None
    stream: bool
    sampling: dict[str, Any] = field(default_factory=dict)

    def pipeline_inputs(self) -> dict[str, Any]:
        """The ``inputs`` dict the pipeline's entry stage receives."""
        return {"messages": self.messages, "sampling": self.sampling, "voice": self.voice}


def _expect(value: Any, kind: type | tuple[type, ...], name: str, what: str) -> Any:
    # bool is an int in Python; a JSON `true` is never a valid number here
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise InvalidRequest(f"'{name}' must be {what}, got {value!r}", field=name)
    if not isinstance(value, kind):
        raise InvalidRequest(f"'{name}' must be {what}, got {type(value).__name__}", field=name)
    return value


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    if body.get(key) is None:
        return None
    value = float(_expect(body[key], (int, float), key, "a number"))
    if not low <= value <= high:
        raise InvalidRequest(f"'{key}' must be between {low:g} and {high:g}, got {value:g}", field=key)
    return value


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    if body.get(key) is None:
        return None
    value = _expect(body[key], int, key, "an integer")
    if value < 1:
        raise InvalidRequest(f"'{key}' must be at least 1, got {value}", field=key)
    return int(value)


def parse_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = _number(body, key, low, high)
        if value is not None:
            sampling[key] = value
    top_k = _positive_int(body, "top_k")
    if top_k is not None:
        sampling["top_k"] = top_k
    if body.get("seed") is not None:
        sampling["seed"] = int(_expect(body["seed"], int, "seed", "an integer"))
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        _expect(stop, list, "stop", "a string or a list of strings")
        for i, item in enumerate(stop):
            _expect(item, str, f"stop[{i}]", "a string")
        sampling["stop"] = list(stop)
    return sampling


def _check_message(index: int, message: Any, limits: Limits) -> None:
    where = f"messages[{index}]"
    _expect(message, dict, where, "an object")
    role = message.get("role")
    if role not in _ROLES:
        raise InvalidRequest(f"'{where}.role' must be one of {', '.join(_ROLES)}, got {role!r}", field=f"{where}.role")
    content = message.get("content")
    if content is None and role == "assistant":
        return
    if isinstance(content, str):
        return
    _expect(content, list, f"{where}.content", "a string or a list of content parts")
    for j, part in enumerate(content):
        _check_part(f"{where}.content[{j}]", part, limits)


def _check_part(where: str, part: Any, limits: Limits) -> None:
    _expect(part, dict, where, "an object")
    kind = part.get("type")
    if kind == "text":
        _expect(part.get("text"), str, f"{where}.text", "a string")
    elif kind == "input_audio":
        audio = _expect(part.get("input_audio"), dict, f"{where}.input_audio", "an object")
        data = _expect(audio.get("data"), str, f"{where}.input_audio.data", "a base64 string")
        fmt = audio.get("format", "wav")
        if fmt not in AUDIO_FORMATS:
            raise InvalidRequest(
                f"'{where}.input_audio.format' must be one of {', '.join(AUDIO_FORMATS)}, got {fmt!r}",
                field=f"{where}.input_audio.format",
            )
        if len(data) * 3 // 4 > limits.max_audio_bytes:
            raise PayloadTooLarge(
                f"'{where}.input_audio.data' decodes to more than {limits.max_audio_bytes} bytes",
                field=f"{where}.input_audio.data",
            )
        try:
            base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise InvalidRequest(f"'{where}.input_audio.data' is not valid base64: {exc}", field=f"{where}.input_audio.data") from exc
    elif kind == "image_url":
        image = _expect(part.get("image_url"), dict, f"{where}.image_url", "an object")
        _expect(image.get("url"), str, f"{where}.image_url.url", "a string")
    else:
        raise InvalidRequest(
            f"'{where}.type' must be text, input_audio or image_url, got {kind!r}", field=f"{where}.type"
        )


def _model_side_check() -> Callable[[dict[str, Any]], Any] | None:
    """The model side's own request check, when the models package provides one."""
    try:
        module = importlib.import_module("omnictl.models.inputs")
    except ModuleNotFoundError:
        return None
    check: Callable[[dict[str, Any]], Any] = module.parse_request
    return check


def parse_chat_request(body: Any, produces: Mapping[str, str], limits: Limits = Limits()) -> ChatRequest:
    """Check a decoded JSON body against the envelope and this topology's terminals.

    ``produces`` maps terminal stage -> modality (``Topology.terminals``). Raises
    :class:`InvalidRequest` (400) or :class:`PayloadTooLarge` (413) naming the field.
    """
    _expect(body, dict, "body", "a JSON object")
    model = body.get("model") or ""
    _expect(model, str, "model", "a string")
    messages = body.get("messages")
    _expect(messages, list, "messages", "a list of messages")
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", field="messages")
    for index, message in enumerate(messages):
        _check_message(index, message, limits)
    if body.get("n") not in (None, 1):
        raise InvalidRequest(f"'n' must be 1 (one choice per request), got {body['n']!r}", field="n")
    stream = body.get("stream", False) or False
    _expect(stream, bool, "stream", "true or false")

    available = sorted(set(produces.values()))
    modalities = body.get("modalities")
    if modalities is None:
        modalities = ["text"] if "text" in available else available
    _expect(modalities, list, "modalities", "a list")
    if not modalities:
        raise InvalidRequest("'modalities' must name at least one output", field="modalities")
    for i, modality in enumerate(modalities):
        if modality not in available:
            raise InvalidRequest(
                f"'modalities[{i}]': this topology cannot produce {modality!r}; it produces {', '.join(available)}",
                field=f"modalities[{i}]",
            )

    audio = body.get("audio") or {}
    _expect(audio, dict, "audio", "an object with 'voice' and 'format'")
    audio_format = audio.get("format", "wav")
    if audio_format not in AUDIO_FORMATS:
        raise InvalidRequest(
            f"'audio.format' {audio_format!r} is not supported; this server produces {', '.join(AUDIO_FORMATS)}",
            field="audio.format",
        )
    voice = audio.get("voice")
    if voice is not None:
        _expect(voice, str, "audio.voice", "a string")
        if voice in OPENAI_VOICES:
            voice = None

    request = ChatRequest(
        model=model,
        messages=messages,
        modalities=list(dict.fromkeys(modalities)),
        audio_format=audio_format,
        voice=voice,
        stream=stream,
        sampling=parse_sampling(body),
    )
    model_check = _model_side_check()
    if model_check is not None:
        model_check(request.pipeline_inputs())
    return request
