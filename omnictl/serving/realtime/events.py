"""The OpenAI Realtime protocol's events (GA names), as typed msgspec structs.

Names and fields follow the types the official ``openai`` package ships in
``openai.types.realtime`` (``tests/serving/realtime`` checks each server event against
them). Client events are decoded in two steps, so a broken one is reported with the
``event_id`` and ``type`` it carried: JSON into a plain object, then that object into its
struct by ``type`` (:func:`decode_client_event`); a field of the wrong shape is named
by its path, e.g. ``session.audio.input.turn_detection.threshold``.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

from omnictl.exceptions import InvalidRequest, RealtimeEventError
from omnictl.serving.common.echo import ECHO_CHARS, clip, clip_repr
from omnictl.serving.common.jsonbody import MAX_DEPTH, check_json

# --- shared pieces --------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class AudioFormat(msgspec.Struct, omit_defaults=True):
    """``audio/pcm`` (16-bit, 24 kHz), or G.711 ``audio/pcmu`` / ``audio/pcma`` (8 kHz, no ``rate``)."""

    type: str = "audio/pcm"
    rate: int | None = None


# ms of silence that ends a turn under server_vad, unless the session sets its own: 700, not
# OpenAI's 500. benchmarks/realtime_turn_detection.py, 42 eval questions with a 600 ms pause
# mid-sentence ("What is the capital of ... Germany?"): 500 ms cut all 42 in two (an answer
# to half a question), 600 ms 67 %, 700 ms 2 %, 800 ms none; semantic_vad (Smart Turn) cut
# 24-52 % by eagerness (it is unsure of synthetic voices). A question's end is confirmed
# ~800 ms after its last word at 700 (~600 at 500), and the preemptive answer (PREEMPT_MS)
# works through most of that wait, so the longer silence costs little of the first audio.
SILENCE_MS = 700


class ServerVad(msgspec.Struct, tag_field="type", tag="server_vad"):
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = SILENCE_MS
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


Eagerness = Literal["low", "medium", "high", "auto"]


class SemanticVad(msgspec.Struct, tag_field="type", tag="semantic_vad"):
    """End of turn decided by a turn model (Smart Turn) rather than by a fixed silence."""

    eagerness: Eagerness = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = Union[ServerVad, SemanticVad]


class Content(msgspec.Struct, omit_defaults=True):
    """One content part of a conversation item."""

    type: str
    text: str | None = None
    audio: str | None = None  # base64, in the session's input format
    transcript: str | None = None


class Item(msgspec.Struct):
    """A conversation item (only messages: this server has no tools)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"] = "user"
    content: list[Content] = []
    id: str | None = None
    object: str = "realtime.item"
    status: str = "completed"


# --- client events --------------------------------------------------------------------------


class AudioInputConfig(msgspec.Struct):
    format: AudioFormat | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    transcription: dict[str, Any] | None | UnsetType = UNSET
    noise_reduction: dict[str, Any] | None | UnsetType = UNSET
    echo_guard: bool | UnsetType = UNSET  # omnictl's: false for a client that cancels echo itself


class AudioOutputConfig(msgspec.Struct):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    speed: float | UnsetType = UNSET


class AudioConfig(msgspec.Struct):
    input: AudioInputConfig | UnsetType = UNSET
    output: AudioOutputConfig | UnsetType = UNSET


class SessionConfig(msgspec.Struct):
    """What ``session.update`` may set; fields left out keep their value. Every field of the
    protocol is read, even those this server cannot honour: those are refused unless they ask
    for nothing (:data:`omnictl.serving.realtime.session.settings.SESSION_UNHONOURED`), where
    left out of this struct they were silently dropped."""

    type: str | UnsetType = UNSET  # "realtime" or "transcription"; left out: the session's own
    instructions: str | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    audio: AudioConfig | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    temperature: float | UnsetType = UNSET  # the beta protocol's: 0.6 to 1.2 for realtime models
    model: str | UnsetType = UNSET
    tools: list[Any] | UnsetType = UNSET  # read to refuse them: no stage produces tool calls
    tool_choice: Any = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET  # moot: there are no tools to call
    # Read to refuse any value but the one asking for nothing (settings.SESSION_UNHONOURED):
    include: Any = UNSET
    tracing: Any = UNSET
    truncation: Any = UNSET
    prompt: Any = UNSET
    reasoning: Any = UNSET


class ResponseAudioOutput(msgspec.Struct):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET


class ResponseAudio(msgspec.Struct):
    output: ResponseAudioOutput | UnsetType = UNSET


class ResponseConfig(msgspec.Struct):
    """What ``response.create`` may set for this one response (the fields it cannot honour are
    read to refuse them: settings.RESPONSE_UNHONOURED)."""

    instructions: str | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    temperature: float | UnsetType = UNSET
    audio: ResponseAudio | UnsetType = UNSET  # this response's voice and output format
    metadata: dict[str, str] | None | UnsetType = UNSET  # echoed on the response's events
    conversation: Any = UNSET
    input: Any = UNSET
    prompt: Any = UNSET
    reasoning: Any = UNSET
    tools: list[Any] | UnsetType = UNSET
    tool_choice: Any = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET  # moot: there are no tools to call


class _ClientEvent(msgspec.Struct, tag_field="type"):
    event_id: str | None = None


class SessionUpdate(_ClientEvent, tag="session.update"):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)


class InputAudioBufferAppend(_ClientEvent, tag="input_audio_buffer.append", kw_only=True):
    audio: str  # required, as OpenAI's reference has it; "" (no audio) is a no-op


class InputAudioBufferCommit(_ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(_ClientEvent, tag="input_audio_buffer.clear"):
    pass


class ConversationItemCreate(_ClientEvent, tag="conversation.item.create"):
    item: Item = msgspec.field(default_factory=Item)
    previous_item_id: str | None = None


class ResponseCreate(_ClientEvent, tag="response.create"):
    response: ResponseConfig = msgspec.field(default_factory=ResponseConfig)


class ResponseCancel(_ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class ConversationItemTruncate(_ClientEvent, tag="conversation.item.truncate", kw_only=True):
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDelete(_ClientEvent, tag="conversation.item.delete", kw_only=True):
    item_id: str


class ConversationItemRetrieve(_ClientEvent, tag="conversation.item.retrieve", kw_only=True):
    item_id: str


class OutputAudioBufferClear(_ClientEvent, tag="output_audio_buffer.clear"):
    pass


ClientEvent = Union[
    SessionUpdate,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    InputAudioBufferClear,
    ConversationItemCreate,
    ConversationItemTruncate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ResponseCreate,
    ResponseCancel,
    OutputAudioBufferClear,
]
CLIENT_EVENT_TYPES = tuple(cls.__struct_config__.tag for cls in ClientEvent.__args__)  # type: ignore[attr-defined]  # a Union alias has __args__ at run time; msgspec structs have __struct_config__


EventError = RealtimeEventError  # the name used across this package


class Refusal:
    """The :class:`EventError` s answering one client event, each carrying its ``event_id``:
    ``raise refuse("why", "code", "param")`` where ``refuse = Refusal(event.event_id)``."""

    __slots__ = ("event_id",)

    def __init__(self, event_id: str | None) -> None:
        self.event_id = event_id

    def __call__(self, message: str, code: str = "invalid_value", param: str | None = None) -> EventError:
        return EventError(message, code, param, self.event_id)


MAX_EVENT_ID = 128  # characters of a client event_id (OpenAI's own are ~25)
# The beta protocol's names of fields the GA protocol moved: once dropped unread (a beta
# client's voice, formats, turn detection and limits silently did nothing), now refused
# naming the GA field to send instead.
_BETA_SESSION = {
    "modalities": "output_modalities",
    "voice": "audio.output.voice",
    "speed": "audio.output.speed",
    "input_audio_format": "audio.input.format",
    "output_audio_format": "audio.output.format",
    "input_audio_transcription": "audio.input.transcription",
    "turn_detection": "audio.input.turn_detection",
    "input_audio_noise_reduction": "audio.input.noise_reduction",
    "max_response_output_tokens": "max_output_tokens",
}
_BETA_RESPONSE = {
    "modalities": "output_modalities",
    "voice": "audio.output.voice",
    "output_audio_format": "audio.output.format",
    "max_response_output_tokens": "max_output_tokens",
}
_BETA = {"session.update": ("session", _BETA_SESSION), "response.create": ("response", _BETA_RESPONSE)}
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def decode_client_event(raw: str | bytes) -> ClientEvent:
    """One client message as its typed event; :class:`EventError` says what is wrong with it.

    What the session could not use later is refused here, as the HTTP routes refuse it
    (:func:`omnictl.serving.common.jsonbody.check_json`): nesting past the recursion limit, lone
    surrogates (an echoed ``event_id`` or ``instructions`` then failed to encode and
    dropped the socket), integers beyond 64 bits (``max_output_tokens`` 2**64 left a
    response without its ``response.done``). Values quoted back are clipped (:func:`clip`)."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventError(f"the message is not valid JSON: {clip(str(exc))}", "invalid_json") from exc
    except RecursionError as exc:
        raise EventError(f"the message is nested more than {MAX_DEPTH} levels deep", "invalid_json") from exc
    if not isinstance(obj, dict):
        raise EventError(f"an event must be a JSON object, got {type(obj).__name__}", "invalid_event")
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    if event_id is not None and (len(event_id) > MAX_EVENT_ID or not event_id.isascii()):
        raise EventError(f"'event_id' must be at most {MAX_EVENT_ID} ASCII characters", "invalid_value", "event_id")
    kind = obj.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise EventError(
            f"unknown event type {clip_repr(kind, 64)}; this server takes {', '.join(CLIENT_EVENT_TYPES)}",
            "invalid_event_type",
            "type",
            event_id,
        )
    try:
        check_json(obj)
    except InvalidRequest as exc:
        param = clip(exc.field, 64) if exc.field else None
        raise EventError(f"{kind}: {clip(str(exc))}", "invalid_value", param, event_id) from exc
    if kind in _BETA:
        where, renamed = _BETA[kind]
        body = obj.get(where)
        for name in body if isinstance(body, dict) else ():
            if name in renamed:
                raise EventError(
                    f"{where}.{name} is the beta protocol's; this server speaks the GA one: send "
                    f"{where}.{renamed[name]}",
                    "invalid_value",
                    f"{where}.{name}",
                    event_id,
                )
    try:
        event: ClientEvent = msgspec.convert(obj, ClientEvent)
    except msgspec.ValidationError as exc:
        match = _PATH.search(str(exc))
        missing = _MISSING.search(str(exc))
        param = ".".join(p for p in (match.group(1) if match else "", missing.group(1) if missing else "") if p)
        param = clip(param, 64) if param else None
        raise EventError(f"{kind}: {clip(str(exc))}", "invalid_value", param, event_id) from exc
    return event


# --- server events --------------------------------------------------------------------------


class SessionObject(msgspec.Struct):
    """The session as ``session.created`` / ``session.updated`` report it."""

    id: str
    model: str
    instructions: str
    output_modalities: list[str]
    audio: dict[str, Any]
    max_output_tokens: int | Literal["inf"]
    type: str = "realtime"
    object: str = "realtime.session"
    transport: str = "websocket"  # an omnictl extra: "webrtc" for a session opened by POST /v1/realtime/calls


class TranscriptionSessionObject(msgspec.Struct):
    """A transcription session (``?intent=transcription`` or ``session.type: "transcription"``)."""

    id: str
    audio: dict[str, Any]
    type: str = "transcription"
    object: str = "realtime.transcription_session"
    transport: str = "websocket"  # an omnictl extra, as on SessionObject


class Usage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class StatusDetails(msgspec.Struct, omit_defaults=True):
    type: str
    reason: str | None = None
    error: dict[str, Any] | None = None


class Response(msgspec.Struct):
    id: str
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    output_modalities: list[str]
    output: list[Item] = []
    status_details: StatusDetails | None = None
    usage: Usage | None = None
    conversation_id: str | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
    metadata: dict[str, str] | None = None  # the client's, from response.create
    object: str = "realtime.response"


class ErrorDetail(msgspec.Struct):
    type: str
    code: str | None
    message: str
    param: str | None
    event_id: str | None


class DurationUsage(msgspec.Struct):
    seconds: float
    type: str = "duration"


class _ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str = msgspec.field(default_factory=lambda: new_id("event"))


class SessionCreated(_ServerEvent, tag="session.created"):
    session: SessionObject | TranscriptionSessionObject


class SessionUpdated(_ServerEvent, tag="session.updated"):
    session: SessionObject | TranscriptionSessionObject


class SpeechStartedEvent(_ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class SpeechStoppedEvent(_ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class Committed(_ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class Cleared(_ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class ItemAdded(_ServerEvent, tag="conversation.item.added"):
    item: Item
    previous_item_id: str | None = None


class ItemDone(_ServerEvent, tag="conversation.item.done"):
    item: Item
    previous_item_id: str | None = None


class TranscriptionCompleted(_ServerEvent, tag="conversation.item.input_audio_transcription.completed"):
    item_id: str
    content_index: int
    transcript: str
    usage: DurationUsage


class TranscriptionDelta(_ServerEvent, tag="conversation.item.input_audio_transcription.delta"):
    item_id: str
    content_index: int
    delta: str


class ItemTruncated(_ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class ItemDeleted(_ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class ItemRetrieved(_ServerEvent, tag="conversation.item.retrieved"):
    item: Item


class OutputAudioBufferCleared(_ServerEvent, tag="output_audio_buffer.cleared"):
    response_id: str


class OutputAudioBufferStarted(_ServerEvent, tag="output_audio_buffer.started"):
    """WebRTC only: the answer's audio started playing on the outbound track."""

    response_id: str


class OutputAudioBufferStopped(_ServerEvent, tag="output_audio_buffer.stopped"):
    """WebRTC only: all of the answer's audio has been played on the outbound track."""

    response_id: str


class ResponseCreated(_ServerEvent, tag="response.created"):
    response: Response


class ResponseDone(_ServerEvent, tag="response.done"):
    response: Response


class OutputItemAdded(_ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Item


class OutputItemDone(_ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Item


class _Part(_ServerEvent, kw_only=True):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartAdded(_Part, tag="response.content_part.added"):
    part: Content


class ContentPartDone(_Part, tag="response.content_part.done"):
    part: Content


class TextDelta(_Part, tag="response.output_text.delta"):
    delta: str


class TextDone(_Part, tag="response.output_text.done"):
    text: str


class AudioDelta(_Part, tag="response.output_audio.delta"):
    delta: str  # base64, in the session's output format


class AudioDone(_Part, tag="response.output_audio.done"):
    pass


class AudioTranscriptDelta(_Part, tag="response.output_audio_transcript.delta"):
    delta: str


class AudioTranscriptDone(_Part, tag="response.output_audio_transcript.done"):
    transcript: str


class ErrorEvent(_ServerEvent, tag="error"):
    error: ErrorDetail


ServerEvent = Union[
    SessionCreated,
    SessionUpdated,
    SpeechStartedEvent,
    SpeechStoppedEvent,
    Committed,
    Cleared,
    ItemAdded,
    ItemDone,
    TranscriptionCompleted,
    TranscriptionDelta,
    ItemTruncated,
    ItemDeleted,
    ItemRetrieved,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    ResponseCreated,
    ResponseDone,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    TextDelta,
    TextDone,
    AudioDelta,
    AudioDone,
    AudioTranscriptDelta,
    AudioTranscriptDone,
    ErrorEvent,
]
SERVER_EVENT_TYPES = tuple(cls.__struct_config__.tag for cls in ServerEvent.__args__)  # type: ignore[attr-defined]  # a Union alias has __args__ at run time; msgspec structs have __struct_config__

_encoder = msgspec.json.Encoder()


def encode(event: ServerEvent) -> str:
    """The event's JSON text. A lone surrogate in any of its strings (text a stage produced:
    client input is refused with one at :func:`decode_client_event`) cannot be written as
    UTF-8: it once raised here, in the middle of a response, and the response never sent its
    ``response.done``. It is written as U+FFFD instead, as a UTF-8 decoder shows bad bytes."""
    try:
        return _encoder.encode(event).decode()
    except UnicodeEncodeError:
        return _encoder.encode(_valid_text(msgspec.to_builtins(event))).decode()


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, a surrogate is always a lone one


def _valid_text(value: Any) -> Any:
    """``value`` (JSON-plain) with every lone surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def error_event(error: EventError) -> ErrorEvent:
    """The ``error`` event answering ``error``; every text in it is bounded and encodable."""
    return ErrorEvent(
        error=ErrorDetail(
            type=error.kind,
            code=error.code,
            message=clip(error.message, 4 * ECHO_CHARS),
            param=clip(error.param, ECHO_CHARS) if error.param else None,
            event_id=clip(error.event_id, MAX_EVENT_ID) if error.event_id else None,
        )
    )
