"""``POST /v1/audio/speech`` (OpenAI TTS): text straight to the audio terminal.

The body is ``{"model", "input", "voice", "response_format", "stream_format", "speed",
"instructions"}``. The pipeline gets an :class:`omnictl.inputs.SpeechRequest`, which the
entry stage routes straight to its audio terminal (see :mod:`omnictl.serving.common.capabilities`):
no speech recognition, no language model.

``response_format``: ``mp3`` (OpenAI's default), ``opus`` (Ogg), ``aac`` (ADTS), ``flac``,
``wav``, ``pcm`` (raw 24 kHz 16-bit mono), encoded by :mod:`omnictl.serving.speech.encode`.
``stream_format: audio`` (the default) sends the encoded bytes as they are produced,
sentence by sentence (chunked transfer); ``sse`` sends ``speech.audio.delta`` events
(base64 of the same bytes) and a ``speech.audio.done`` with the usage. Either way the
status line waits for the first audio, so a request the pipeline refuses (an unknown
voice) is still a JSON 400, not a 200 with an empty body.

``"stream": true`` (vLLM's spelling) is ``stream_format: sse``. The sampling extensions
vLLM's and SGLang's speech servers take (``max_new_tokens``, ``temperature``, ``top_p``,
``top_k``, ``seed``) are checked as :class:`omnictl.sampling.SamplingParams` and reach the TTS
stage, which honours them or refuses them by name (Piper has nothing to sample: a 400). Text
with nothing to speak (no letter or digit), or that the voice turns into no audio at all, is
a 400 naming ``input``: an empty body is no audio file.

``speed`` (0.25–4.0) reaches the TTS stage, which applies it. ``instructions`` (steering
tone or accent) is accepted because OpenAI's clients send it, but a Piper voice has no
way to follow it: the response says so in its ``X-Omnictl-Ignored: instructions`` header.
"""

from __future__ import annotations

import math
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnictl.inputs import SpeechRequest
from omnictl.outputs import AUDIO, AudioChunk, AudioResult
from omnictl.request import RequestEventKind
from omnictl.sampling import SamplingParams
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.chat.sse import error_body, sse_error, sse_event
from omnictl.serving.common import tracking as chat
from omnictl.serving.common.errors import field_error, outcome_event, outcome_response
from omnictl.serving.common.eventstream import EventStreamResponse
from omnictl.serving.common.intake import Admitted, Submission, admit
from omnictl.serving.common.jsonbody import decode_json
from omnictl.serving.speech.encode import MEDIA_TYPES, AudioStreamEncoder, b64
from omnictl.serving.state import PipelineLike, ServingState

ENDPOINT = "/v1/audio/speech"
MAX_INPUT_CHARS = 4096  # OpenAI's limit too
FORMATS = {"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "wav", "pcm": "pcm16"}  # -> encoder
DEFAULT_FORMAT = "mp3"  # OpenAI's default
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# The extensions vLLM's and SGLang's speech servers take, as they name them -> the sampling
# type's names. The TTS stage honours them or refuses them by name (Piper refuses them all).
SAMPLING_KEYS = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
}
_KEYS = {
    "model",
    "input",
    "voice",
    "response_format",
    "stream_format",
    "speed",
    "instructions",
    "stream",
    *SAMPLING_KEYS,
}
IGNORED_HEADER = "X-Omnictl-Ignored"
NOTHING_SPOKEN = "'input' has nothing the voice could speak (it made no audio of it); send words"


def _choice(body: dict[str, Any], key: str, allowed: Any, default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):  # a list or an object is not a name (and not hashable)
        raise field_error(key, f"must be a string, one of {', '.join(allowed)}; got a JSON {type(value).__name__}")
    if value not in allowed:
        raise field_error(key, f"{value!r} is not supported; choose one of {', '.join(allowed)}")
    return value


def parse_speech(body: Any) -> tuple[SpeechRequest, str, bool, str, bool]:
    """(request, response_format, sse, model, instructions given) from a decoded body;
    InvalidRequest names the field."""
    if not isinstance(body, dict):
        raise field_error("body", "must be a JSON object")
    for key in body:
        if key not in _KEYS:
            raise field_error(key, f"is not a field of this endpoint (expected one of {', '.join(sorted(_KEYS))})")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise field_error("input", "must be non-empty text")
    if len(text) > MAX_INPUT_CHARS:
        raise field_error("input", f"is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
    if not any(ch.isalnum() for ch in text):  # only punctuation, symbols, emoji or control characters
        raise field_error("input", "has nothing to speak (no letter or digit in it)")
    voice = body.get("voice")
    if voice is not None and (not isinstance(voice, str) or not voice):
        raise field_error("voice", f"must be a voice name, got {type(voice).__name__}")
    fmt = _choice(body, "response_format", FORMATS, DEFAULT_FORMAT)
    stream_format = _choice(body, "stream_format", ("audio", "sse"), "audio")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise field_error("stream", f"must be true or false, got {stream!r}")
    if stream:  # vLLM's spelling of the SSE stream
        if body.get("stream_format") == "audio":
            raise field_error("stream", "true asks for the SSE stream; stream_format 'audio' asks for the raw one")
        stream_format = "sse"
    raw = {SAMPLING_KEYS[key]: body[key] for key in SAMPLING_KEYS if body.get(key) is not None}
    sampling = SamplingParams.from_mapping(raw, where="", names={name: key for key, name in SAMPLING_KEYS.items()})
    speed = body.get("speed", 1.0)
    if speed is None:
        speed = 1.0
    if (
        isinstance(speed, bool)
        or not isinstance(speed, (int, float))
        or not math.isfinite(speed)
        or not MIN_SPEED <= speed <= MAX_SPEED
    ):
        raise field_error("speed", f"must be a number from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise field_error("instructions", f"must be a string, got {type(instructions).__name__}")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise field_error("model", "must be a string")
    chosen = None if voice is None or voice in OPENAI_VOICES else voice
    return (
        SpeechRequest(text=text, voice=chosen, speed=float(speed), sampling=sampling),
        fmt,
        stream_format == "sse",
        model,
        bool(instructions),
    )


async def _parse(request: Request, raw: bytes, pipe: PipelineLike) -> Submission[tuple[str, bool, bool]]:
    speech, fmt, sse, model, instructions = parse_speech(decode_json(raw))
    return Submission(speech, [AUDIO], model, (fmt, sse, instructions), FORMATS[fmt])


async def _audio(tracked: chat.Tracked) -> AsyncIterator[AudioChunk | chat.PipelineEvent]:
    """The request's audio in order (its result only when nothing streamed before it), or
    the error / aborted event that ends the request (the request is finished then)."""
    streamed = sent = False
    async for event in tracked.request.events():
        if event.kind is RequestEventKind.ERROR:
            tracked.finish("rejected" if event.field is not None else "failed", chat.error_of(event))
            yield event
            return
        if event.kind is RequestEventKind.ABORTED:
            tracked.finish("aborted")
            yield event
            return
        data = event.data
        if not isinstance(data, AudioChunk) or (isinstance(data, AudioResult) and streamed):
            continue
        streamed = streamed or event.kind is RequestEventKind.STREAM
        sent = True
        yield data
        tracked.saw(data)  # once the body asks for the next one: this one has been sent
    if sent:
        tracked.finish("completed")
    else:  # the voice made nothing of the text: the route answers 400 naming `input`
        tracked.finish("rejected", NOTHING_SPOKEN)


def client_field(field: str) -> str:
    """A field a stage named, as the speech body names it (``sampling.max_tokens`` came as ``max_new_tokens``)."""
    name = field.removeprefix("sampling.")
    return next((key for key, ours in SAMPLING_KEYS.items() if ours == name), name) if name != field else field


def _refusal(tracked: chat.Tracked, event: chat.PipelineEvent) -> JSONResponse:
    """The JSON error for a request that ended before its first audio."""
    return outcome_response(chat.outcome_of(tracked, event, client_field))


async def _sse(
    tracked: chat.Tracked, first: AudioChunk | None, rest: AsyncIterator[Any], characters: int
) -> AsyncIterator[bytes]:
    encoder = AudioStreamEncoder(tracked.audio_format)
    item: Any = first
    while item is not None:
        if not isinstance(item, AudioChunk):
            # the stream names a stage's field as the stage did, and an abort as the client's
            yield outcome_event(chat.outcome_of(tracked, item, shutdown=False))
            return
        data = encoder.encode(item.samples, item.sample_rate)
        if data:
            yield sse_event({"type": "speech.audio.delta", "audio": b64(data)})
        item = await anext(rest, None)
    last = encoder.finish()
    if last:
        yield sse_event({"type": "speech.audio.delta", "audio": b64(last)})
    # Piper reads characters (as phonemes) and writes samples: it has no tokens to bill. The
    # token counts are zero, and what it did use is given beside them.
    usage = {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "input_characters": characters,
        "output_seconds": round(encoder.seconds, 3),
    }
    yield sse_event({"type": "speech.audio.done", "usage": usage, "seconds": round(encoder.seconds, 3)})


async def _bytes(tracked: chat.Tracked, first: AudioChunk | None, rest: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    encoder = AudioStreamEncoder(tracked.audio_format)
    item: Any = first
    while item is not None:
        if not isinstance(item, AudioChunk):
            return  # the status line is sent: ending the body early is all a raw stream can say
        data = encoder.encode(item.samples, item.sample_rate)
        if data:
            yield data
        item = await anext(rest, None)
    last = encoder.finish()
    if last:
        yield last


def endpoint(state: ServingState) -> Callable[[Request], Awaitable[Response | EventStreamResponse]]:
    async def speech(request: Request) -> Response | EventStreamResponse:
        admitted = await admit(state, request, _parse, ENDPOINT)
        if not isinstance(admitted, Admitted):
            return admitted
        tracked, (fmt, sse, instructions) = admitted.tracked, admitted.submission.extra
        abort = admitted.pipeline.abort

        async def on_disconnect() -> None:
            if tracked.outcome is None:
                await abort(tracked.request.id)
                tracked.finish("aborted")

        # The status line waits for the first audio: a request the pipeline refuses before
        # speaking (an unknown voice) gets its JSON error, not a 200 with an empty body.
        tracked.plays(ENDPOINT)
        items = _audio(tracked)
        here, first = await chat.first_item(items, request)
        if not here:
            await on_disconnect()
            return Response(status_code=499)  # nobody reads it: the client has gone
        if first is not None and not isinstance(first, AudioChunk):
            return _refusal(tracked, first)
        if first is None:  # ended without a sample: an empty body would be no audio file at all
            return JSONResponse(
                error_body(NOTHING_SPOKEN, "invalid_request_error", "invalid_request", "input"), status_code=400
            )
        headers = {IGNORED_HEADER: "instructions"} if instructions else {}
        if sse:
            closing = sse_error("the server failed to send the audio", "server_error", "internal_error")
            characters = len(admitted.submission.inputs.text)
            return EventStreamResponse(
                _sse(tracked, first, items, characters),
                on_disconnect,
                headers=headers,
                on_failure=chat.on_stream_failure(tracked, abort, closing),
            )
        return EventStreamResponse(
            _bytes(tracked, first, items),
            on_disconnect,
            headers=headers,
            media_type=MEDIA_TYPES[FORMATS[fmt]],
            on_failure=chat.on_stream_failure(tracked, abort, b""),
        )

    return speech
