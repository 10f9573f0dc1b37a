"""``POST /v1/audio/speech`` (OpenAI TTS): text straight to the audio terminal.

The body is ``{"model", "input", "voice", "response_format", "stream_format"}``. The
pipeline gets an :class:`omnictl.inputs.SpeechRequest`, which the entry stage routes
straight to its audio terminal (see :mod:`omnictl.serving.capabilities`): no speech
recognition, no language model. ``response_format`` ``wav`` is one whole file (its header
knows the length), ``pcm`` raw 24 kHz 16-bit mono streamed as it is spoken;
``stream_format: sse`` streams ``speech.audio.delta`` events instead.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Awaitable, Callable

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from omnictl.coordinator.request import RequestEventKind
from omnictl.exceptions import InvalidRequest
from omnictl.inputs import SpeechRequest
from omnictl.outputs import AUDIO, AudioChunk, AudioResult
from omnictl.serving import chat
from omnictl.serving.admission import Admitted, Submission, admit
from omnictl.serving.audio import AudioStreamEncoder, b64, encode_whole
from omnictl.serving.errors import field_error
from omnictl.serving.eventstream import EventStreamResponse
from omnictl.serving.protocol import OPENAI_VOICES
from omnictl.serving.sse import sse_error, sse_event
from omnictl.serving.state import PipelineLike, ServingState

ENDPOINT = "/v1/audio/speech"
MAX_INPUT_CHARS = 4096  # OpenAI's limit too
FORMATS = {"wav": ("wav", "audio/wav"), "pcm": ("pcm16", "audio/pcm")}  # response_format -> (encoder, media type)
_KEYS = {"model", "input", "voice", "response_format", "stream_format", "speed", "instructions"}


def parse_speech(body: Any) -> tuple[SpeechRequest, str, bool, str]:
    """(request, response_format, sse, model) from a decoded body; InvalidRequest names the field."""
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
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise field_error("voice", f"must be a voice name, got {type(voice).__name__}")
    fmt = body.get("response_format") or "wav"  # OpenAI defaults to mp3, which this server does not encode
    if fmt not in FORMATS:
        raise field_error("response_format", f"{fmt!r} is not supported; this server produces {', '.join(FORMATS)}")
    stream_format = body.get("stream_format") or "audio"
    if stream_format not in ("audio", "sse"):
        raise field_error("stream_format", f"must be 'audio' or 'sse', got {stream_format!r}")
    if body.get("speed") not in (None, 1, 1.0):
        raise field_error("speed", f"{body['speed']!r} is not supported; this server speaks at speed 1.0")
    if body.get("instructions"):
        raise field_error("instructions", "are not supported: the voice cannot be steered by instructions")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise field_error("model", "must be a string")
    chosen = None if voice is None or voice in OPENAI_VOICES else voice
    return SpeechRequest(text=text, voice=chosen), fmt, stream_format == "sse", model


async def _parse(request: Request, raw: bytes, pipe: PipelineLike) -> Submission[tuple[str, bool]]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", field="body") from exc
    speech, fmt, sse, model = parse_speech(body)
    return Submission(speech, [AUDIO], model, (fmt, sse), FORMATS[fmt][0])


async def _audio(tracked: chat.Tracked) -> AsyncIterator[AudioChunk | chat.PipelineEvent]:
    """The request's audio in order (its result only when nothing streamed before it), or
    the error / aborted event that ends the request (the request is finished then)."""
    streamed = False
    async for event in tracked.request.events():
        if event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
            if event.kind is RequestEventKind.ERROR:
                tracked.finish("failed", str(event.error))  # logged once there, with why
            else:
                tracked.finish("aborted")
            yield event
            return
        data = event.data
        if not isinstance(data, AudioChunk) or (isinstance(data, AudioResult) and streamed):
            continue
        streamed = streamed or event.kind is RequestEventKind.STREAM
        tracked.saw(data)
        yield data
    tracked.finish("completed")


async def _sse(tracked: chat.Tracked) -> AsyncIterator[bytes]:
    encoder = AudioStreamEncoder(tracked.audio_format)
    async for item in _audio(tracked):
        if isinstance(item, AudioChunk):
            yield sse_event({"type": "speech.audio.delta", "audio": b64(encoder.encode(item.samples, item.sample_rate))})
        elif item.kind is RequestEventKind.ERROR:
            yield sse_error(f"stage {item.stage!r}: {item.error}", "server_error", "stage_failed")
            return
        else:
            yield sse_error("the request was aborted", "server_error", "aborted")
            return
    yield sse_event({"type": "speech.audio.done", "seconds": round(encoder.seconds, 3)})


async def _pcm(tracked: chat.Tracked) -> AsyncIterator[bytes]:
    encoder = AudioStreamEncoder("pcm16")
    async for item in _audio(tracked):
        if not isinstance(item, AudioChunk):
            return  # the status line is sent: ending the body early is all a raw stream can say
        yield encoder.encode(item.samples, item.sample_rate)


def endpoint(state: ServingState) -> Callable[[Request], Awaitable[Response | EventStreamResponse]]:
    async def speech(request: Request) -> Response | EventStreamResponse:
        admitted = await admit(state, request, _parse, ENDPOINT)
        if not isinstance(admitted, Admitted):
            return admitted
        tracked, (fmt, sse) = admitted.tracked, admitted.submission.extra
        abort = admitted.pipeline.abort

        async def on_disconnect() -> None:
            if tracked.outcome is None:
                await abort(tracked.request.id)
                tracked.finish("aborted")

        if sse:
            return EventStreamResponse(_sse(tracked), on_disconnect)
        if fmt == "pcm":
            return EventStreamResponse(_pcm(tracked), on_disconnect, media_type=FORMATS[fmt][1])
        outcome = await chat.results(tracked, request, abort)
        if isinstance(outcome, Response):
            return outcome
        audio = next((data for data in outcome.values() if isinstance(data, AudioResult)), None)
        samples, rate = (audio.samples, audio.sample_rate) if audio else (np.zeros(0, np.float32), 24_000)
        tracked.finish("completed")
        return Response(encode_whole(samples, rate, "wav"), media_type=FORMATS[fmt][1])

    return speech
