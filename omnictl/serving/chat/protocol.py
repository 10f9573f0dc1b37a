"""The OpenAI chat-completions request envelope, checked field by field.

This module checks the HTTP envelope (model, stream, n, modalities, the output audio
format and voice), maps the sampling fields onto :class:`omnictl.sampling.SamplingParams`
(which checks them), refuses fields it does not take by name, and hands the messages to
:func:`omnictl.inputs.parse_request`, the one parser of request contents. That is where
each input audio part is base64-decoded, once, after its size is checked; the typed
request it returns is what the pipeline's entry stage receives.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import ChatRequest as PipelineRequest  # ChatRequest, here, is the HTTP envelope
from omnictl.inputs import parse_request
from omnictl.sampling import SamplingParams
from omnictl.serving.common.jsonbody import decode_json
from omnictl.serving.speech.encode import FORMATS as OUTPUT_FORMATS  # wav, pcm16, mp3, opus, aac, flac

# OpenAI's own voice names. Clients such as the `openai` package insist on one of them,
# so they mean "this topology's default voice" rather than failing at the speech stage.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar"}
)
# A body up to this size is parsed on the event loop; a bigger one in a worker thread.
# Measured on the 2-core dev machine: parsing a body of base64 WAV costs ~6 ms per MiB
# (JSON, base64, WAV read, NaN scan), a text-only body ~30 us, an `asyncio.to_thread`
# round trip ~0.2 ms. Inline, a body stalls the loop (the coordinator, every other
# request's stream) at most ~1.5 ms; below that the hop would add latency to the common
# small request (text, a short clip) to save a stall too short to matter.
INLINE_PARSE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024
    max_audio_bytes: int = 16 * 1024 * 1024  # decoded size of one input_audio part
    max_realtime_message_bytes: int = 1024 * 1024  # one /v1/realtime client event (~20 s of audio in one append)
    max_realtime_buffer_bytes: int = 120 * 2 * 24_000  # a realtime session's input audio buffer: 120 s of pcm16
    # Duration of one input_audio part. With the sample rate bounded too (1 kHz - 384 kHz),
    # this bounds the work a few header bytes can ask for (a WAV "at 1 Hz" once meant
    # ~80 s of resampling in the entry stage).
    max_audio_seconds: float = 600.0
    # A client that declares a body and then sends it slower than this (or never: a
    # half-open connection) is answered 408 instead of holding its connection forever.
    body_timeout_s: float = 30.0
    # A connection must finish its request headers this soon after opening (or after its
    # previous response), or it is closed: a socket that sends nothing must not stay forever.
    header_timeout_s: float = 10.0
    # Open connections (HTTP and WebSocket); None: as many as the open-files limit allows
    # (see omnictl.serving.common.connections.connection_cap, which keeps a reserve below it either way).
    max_connections: int | None = None
    max_realtime_sessions: int = 16  # /v1/realtime sessions at once; one more is refused with an error event
    # WebRTC calls among them not yet connected (offer taken, peer connection not connected):
    # offers that never connect hold at most these slots, for at most the connect timeout.
    max_realtime_connecting: int = 4
    realtime_connect_timeout_s: float = 10.0  # from an offer's arrival to its call connected
    # Server events one realtime session may have waiting for a client that does not read
    # (characters of JSON); past it the session is closed with code 1008.
    max_realtime_outbox_bytes: int = 8 * 1024 * 1024
    # What one realtime session may hold: its input buffer and conversation (audio as
    # float32 until transcribed, text). A commit or item past it is refused with an error.
    max_realtime_session_bytes: int = 32 * 1024 * 1024
    # Input audio a session may append, as a multiple of real time once its first
    # `realtime_audio_burst_s` seconds are spent (server VAD keeps up at that rate).
    realtime_audio_speed: float = 8.0
    realtime_audio_burst_s: float = 240.0  # two full input buffers
    # Tokens a realtime conversation keeps (estimated: 4 characters a token, 25 tokens a second
    # of untranscribed audio; see realtime/turns.py); past it the oldest items are dropped, as
    # OpenAI's server does.
    max_realtime_conversation_tokens: int = 6_000


@dataclass(frozen=True)
class ChatRequest:
    """What the HTTP layer needs from one chat-completions body: the envelope's answers,
    and ``inputs``, the typed request the pipeline receives (sampling and voice inside)."""

    model: str
    modalities: list[str]
    audio_format: str
    stream: bool
    inputs: PipelineRequest


def _expect(value: Any, kind: type | tuple[type, ...], name: str, what: str) -> Any:
    # bool is an int in Python; a JSON `true` is never a valid number here
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise InvalidRequest(f"'{name}' must be {what}, got {value!r}", field=name)
    if not isinstance(value, kind):
        raise InvalidRequest(f"'{name}' must be {what}, got {type(value).__name__}", field=name)
    return value


# What a chat-completions body may hold. The sampling fields are OpenAI's (``logprobs``,
# ``top_logprobs``, ``logit_bias``, the penalties, ``seed``, ``stop``) plus the extensions
# vLLM's and SGLang's servers take (``top_k``, ``min_p``, ``repetition_penalty``); the stage
# that generates honours each or refuses it by name (a 400). The rest of OpenAI's fields are
# refused by name, not ignored: a client that sends one expects it to act.
SAMPLING_KEYS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
)
_ENVELOPE_KEYS = ("model", "messages", "stream", "n", "modalities", "audio")
# Fields that change nothing here and are accepted as such: who the end user is (`user`,
# `safety_identifier`), and tool settings while no tool is offered (those are refused below).
_INERT_KEYS = ("user", "safety_identifier", "tools", "functions", "tool_choice", "function_call", "parallel_tool_calls")
BODY_KEYS = frozenset(_ENVELOPE_KEYS + SAMPLING_KEYS + _INERT_KEYS + ("stream_options", "response_format"))


def parse_sampling(body: Mapping[str, Any]) -> SamplingParams:
    """The body's sampling fields, under OpenAI's names, as the one sampling type (which
    checks them, naming each field as the body does)."""
    raw = {key: body[key] for key in SAMPLING_KEYS if body.get(key) is not None}
    names = {}
    if "max_completion_tokens" in raw:  # OpenAI's newer name wins over the deprecated one
        raw["max_tokens"] = raw.pop("max_completion_tokens")
        names["max_tokens"] = "max_completion_tokens"
    return SamplingParams.from_mapping(raw, where="", names=names)


def _unknown_fields(body: Mapping[str, Any]) -> None:
    for key in body:
        if key not in BODY_KEYS:
            raise InvalidRequest(
                f"'{key}' is not a field this server takes; send the request without it "
                "(docs/serving.md lists the fields each endpoint takes)",
                field=str(key),
            )
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:  # text is what every answer is
        raise InvalidRequest(
            f"'response_format' {response_format!r}: this server answers in plain text only ({{'type': 'text'}})",
            field="response_format",
        )
    options = body.get("stream_options")
    if options is not None:
        _expect(options, dict, "stream_options", "an object")
        for key, value in options.items():
            # usage is always in the last chunk; include_usage asks for what is sent anyway
            if key != "include_usage" or not isinstance(value, bool):
                raise InvalidRequest(
                    f"'stream_options.{key}': only include_usage (true or false) is taken",
                    field=f"stream_options.{key}",
                )


def _modalities(body: Mapping[str, Any], produces: Mapping[str, str]) -> list[str]:
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
    return list(dict.fromkeys(modalities))


def _audio_output(body: Mapping[str, Any]) -> tuple[str, str | None]:
    """The answer's audio format and voice (None: the topology's default voice)."""
    audio = body.get("audio") or {}
    _expect(audio, dict, "audio", "an object with 'voice' and 'format'")
    audio_format = audio.get("format", "wav")
    if not isinstance(audio_format, str) or audio_format not in OUTPUT_FORMATS:
        shown = repr(audio_format) if isinstance(audio_format, str) else f"a JSON {type(audio_format).__name__}"
        raise InvalidRequest(
            f"'audio.format' {shown} is not supported; this server produces {', '.join(OUTPUT_FORMATS)}",
            field="audio.format",
        )
    voice = audio.get("voice")
    if voice is None or voice in OPENAI_VOICES:
        return audio_format, None
    if not _expect(voice, str, "audio.voice", "a string"):
        raise InvalidRequest("'audio.voice' must name a voice, got an empty string", field="audio.voice")
    return audio_format, voice


def _no_tools(body: Mapping[str, Any]) -> None:
    """Tool calling asked for is refused, not ignored: no omnictl terminal produces tool
    calls (its output contract is text, audio and transcripts), so a model would answer as
    if no tool had been offered."""
    for key in ("tools", "functions"):  # `functions` / `function_call`: the older spelling
        if body.get(key):
            raise InvalidRequest(
                f"'{key}': this topology cannot call tools (no stage produces tool calls); "
                "send the request without them",
                field=key,
            )
    for key in ("tool_choice", "function_call"):
        choice = body.get(key)
        if choice is not None and choice != "none":
            raise InvalidRequest(
                f"'{key}' {choice!r}: this topology cannot call tools; only 'none' is accepted", field=key
            )


def parse_chat_request(body: Any, produces: Mapping[str, str], limits: Limits = Limits()) -> ChatRequest:
    """Check a decoded JSON body against the envelope and this topology's terminals, then
    parse its messages (decoding input audio) into the pipeline's typed request.

    ``produces`` maps terminal stage -> modality (``Topology.terminals``). Raises
    :class:`InvalidRequest` (400) or :class:`PayloadTooLarge` (413) naming the field.
    The envelope is checked first: a request refused for its envelope decodes nothing.
    """
    _expect(body, dict, "body", "a JSON object")
    model = body.get("model") or ""
    _expect(model, str, "model", "a string")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):  # `true` and `1.0` equal 1 in Python
        raise InvalidRequest(f"'n' must be 1 (one choice per request), got {n!r}", field="n")
    stream = body.get("stream")
    stream = False if stream is None else _expect(stream, bool, "stream", "true or false")
    _unknown_fields(body)
    _no_tools(body)
    modalities = _modalities(body, produces)
    audio_format, voice = _audio_output(body)
    sampling = parse_sampling(body)
    request = {"messages": body.get("messages"), "sampling": sampling, "voice": voice}
    inputs = parse_request(request, max_audio_bytes=limits.max_audio_bytes, max_audio_seconds=limits.max_audio_seconds)
    return ChatRequest(model=model, modalities=modalities, audio_format=audio_format, stream=stream, inputs=inputs)


def _parse_raw(raw: bytes, produces: Mapping[str, str], limits: Limits) -> ChatRequest:
    return parse_chat_request(decode_json(raw), produces, limits)


async def parse_chat_body(raw: bytes, produces: Mapping[str, str], limits: Limits = Limits()) -> ChatRequest:
    """JSON-decode ``raw`` and :func:`parse_chat_request` it; in a worker thread when it is
    large (``INLINE_PARSE_BYTES``): decoding megabytes of audio must not stall the event
    loop that streams every other request's answer and runs the coordinator."""
    if len(raw) <= INLINE_PARSE_BYTES:
        return _parse_raw(raw, produces, limits)
    return await asyncio.to_thread(_parse_raw, raw, produces, limits)
