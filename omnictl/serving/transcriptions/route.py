"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (OpenAI speech to text):
speech recognition only.

Multipart fields, as OpenAI documents them: ``file`` (any format FFmpeg decodes: wav,
mp3, m4a, ogg, webm, flac...; see :mod:`omnictl.serving.transcriptions.audiofile`), ``model``,
``language`` (transcriptions), ``prompt``, ``response_format`` (``json`` | ``text`` |
``verbose_json`` | ``srt`` | ``vtt``), ``temperature``, ``stream``,
``timestamp_granularities[]`` (``segment``, ``word``; with ``verbose_json``),
``include[]`` (``logprobs``), ``chunking_strategy`` (``auto``). The diarization fields
(``known_speaker_names[]``, ``known_speaker_references[]``) are refused with a 400:
Whisper does not tell speakers apart.

The pipeline gets a one-message chat request holding the decoded audio, for the
``transcript`` modality alone: modality pruning runs only the stages that lead to the
topology's ``transcript`` terminal (the voice assistant: preprocessing and asr; no LLM,
no speech). A request that needs more than the text (timestamps, a prompt, a
temperature, a stream, a translation) carries :class:`omnictl.inputs.RecognitionOptions`.

``stream=true`` answers with server-sent events: a ``transcript.text.delta`` per
segment, as the recognizer decodes it, then ``transcript.text.done`` with the text.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import msgspec
import numpy as np
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Message

from omnictl.exceptions import InvalidRequest, PayloadTooLarge, RequestAborted
from omnictl.inputs import RecognitionOptions, parse_request
from omnictl.outputs import TRANSCRIPT, Transcript, TranscriptSegment
from omnictl.request import RequestEventKind
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.chat.sse import sse_error, sse_event
from omnictl.serving.common import tracking as chat
from omnictl.serving.common.errors import field_error, outcome_event, outcome_response
from omnictl.serving.common.eventstream import EventStreamResponse
from omnictl.serving.common.intake import Admitted, Submission, admit
from omnictl.serving.state import PipelineLike, ServingState
from omnictl.serving.transcriptions.audiofile import decode_audio_file

log = logging.getLogger(__name__)

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")
_COMMON = {"file", "model", "prompt", "response_format", "temperature"}
_FIELDS = {
    "transcribe": _COMMON | {"language", "stream", "timestamp_granularities[]", "include[]", "chunking_strategy"},
    "translate": _COMMON,
}
_DIARIZATION = ("known_speaker_names[]", "known_speaker_references[]")
_MEDIA = {"srt": "application/x-subrip", "vtt": "text/vtt"}
HANGUP_POLL_S = 0.1  # how often a decode in progress checks whether its client is still there


@dataclass(frozen=True)
class Answer:
    """How to answer one request."""

    task: str  # transcribe | translate
    fmt: str
    stream: bool
    words: bool
    segments: bool
    logprobs: bool


async def _form(request: Request, raw: bytes) -> Any:
    """The multipart form of a body already read (and size-checked) by admission."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise field_error("body", "must be multipart/form-data with a 'file' field")
    try:
        return await Request(request.scope, replay).form(max_files=1, max_fields=32)
    except (MultiPartException, ValueError) as exc:
        raise field_error("body", f"is not a readable multipart form ({exc})") from exc
    except HTTPException as exc:  # what Starlette makes of a MultiPartException inside an app: plain text, not our JSON
        raise field_error("body", f"is not a readable multipart form ({exc.detail})") from exc


def _field(form: Any, name: str) -> str | None:
    values = form.getlist(name)
    if len(values) > 1:
        raise field_error(name, "is given more than once")
    value = values[0] if values else None
    if value is not None and not isinstance(value, str):
        raise field_error(name, "must be a plain form field")
    return value


def _list(form: Any, name: str, allowed: tuple[str, ...]) -> set[str]:
    chosen = set()
    for value in form.getlist(name) + form.getlist(name.removesuffix("[]")):
        if not isinstance(value, str) or value not in allowed:
            raise field_error(name, f"{value!r} is not supported; choose from {', '.join(allowed)}")
        chosen.add(value)
    return chosen


def _options(form: Any, task: str) -> tuple[Answer, RecognitionOptions | None, str | None]:
    """What the form asks for: how to answer, what to ask of the recognizer (None: its
    defaults will do), and the language."""
    fields = _FIELDS[task]
    for key in form.keys():
        if key in _DIARIZATION and task == "transcribe":
            raise field_error(key, "is not supported: Whisper does not tell speakers apart (no diarization)")
        if key not in fields and key.removesuffix("[]") + "[]" not in fields:
            raise field_error(key, f"is not a field of this endpoint (it reads {', '.join(sorted(fields))})")
    fmt = _field(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise field_error("response_format", f"{fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    stream_value = (_field(form, "stream") or "false").lower()
    if stream_value not in ("true", "false"):
        raise field_error("stream", f"must be true or false, got {stream_value!r}")
    stream = stream_value == "true"
    if stream and fmt not in ("json", "text"):
        raise field_error("stream", f"streams text events; it cannot stream response_format {fmt!r} (use json or text)")
    granularities = _list(form, "timestamp_granularities[]", GRANULARITIES) if task == "transcribe" else set()
    if granularities and fmt != "verbose_json":
        raise field_error("timestamp_granularities[]", "needs response_format 'verbose_json' (as OpenAI's)")
    logprobs = "logprobs" in (_list(form, "include[]", ("logprobs",)) if task == "transcribe" else set())
    if logprobs and fmt != "json":
        raise field_error("include[]", "'logprobs' needs response_format 'json' (as OpenAI's)")
    chunking = _field(form, "chunking_strategy")
    if chunking is not None and chunking != "auto":
        raise field_error(
            "chunking_strategy", f"only 'auto' is supported (Whisper's own 30 s windows), got {chunking!r}"
        )
    temperature: float | None = None
    raw_temperature = _field(form, "temperature")
    if raw_temperature not in (None, ""):
        try:
            temperature = float(raw_temperature)
        except ValueError:
            raise field_error("temperature", f"must be a number from 0 to 1, got {raw_temperature!r}") from None
        if not math.isfinite(temperature) or not 0 <= temperature <= 1:
            raise field_error("temperature", f"must be a number from 0 to 1, got {raw_temperature!r}")
    prompt = _field(form, "prompt") or None
    language = (_field(form, "language") or None) if task == "transcribe" else None
    # verbose_json always has segments (OpenAI's does); srt and vtt are made of them
    segments = fmt in ("verbose_json", "srt", "vtt")
    words = "word" in granularities or logprobs  # logprobs: Whisper's per-word probabilities
    answer = Answer(task, fmt, stream, words, segments, logprobs)
    needs_options = task == "translate" or segments or words or stream or prompt is not None or temperature is not None
    # streamed: with timestamps, Whisper ends a segment at each phrase, not at each 30 s window
    options = (
        RecognitionOptions(
            task=task, prompt=prompt, temperature=temperature, timestamps=segments or stream, words=words, stream=stream
        )
        if needs_options
        else None
    )
    return answer, options, language


async def parse_audio_form(request: Request, raw: bytes, limits: Limits, task: str) -> tuple[Any, Answer, str]:
    """(the pipeline's inputs, how to answer, model) of a multipart body."""
    form = await _form(request, raw)
    answer, options, language = _options(form, task)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise field_error("file", "is missing: send the audio as a file field")
    data = await upload.read()
    if len(data) > limits.max_audio_bytes:
        raise PayloadTooLarge(f"'file' is {len(data)} bytes; the limit is {limits.max_audio_bytes}", field="file")
    samples, rate = await decode_off_the_loop(request, data, limits)
    audio = {"type": "input_audio", "input_audio": {"data": samples, "sample_rate": rate}}
    request_inputs: dict[str, Any] = {"messages": [{"role": "user", "content": [audio]}]}
    if language is not None:
        request_inputs["language"] = language
    try:
        inputs = parse_request(request_inputs, max_audio_seconds=limits.max_audio_seconds)
    except InvalidRequest as exc:  # name the form's field, not the internal message's
        field = "language" if exc.field == "language" else "file"
        raise field_error(field, str(exc).split(": ", 1)[-1]) from exc
    if options is not None:
        inputs = msgspec.structs.replace(inputs, recognition=options)
    return inputs, answer, _field(form, "model") or ""


async def decode_off_the_loop(request: Request, data: bytes, limits: Limits) -> tuple[np.ndarray, int]:
    """The upload decoded once, in a worker thread whatever its size (a few bytes may be a
    file FFmpeg takes seconds over; the loop streams every other request's answer
    meanwhile). A client that hangs up meanwhile stops the decode at its next frame
    (ClientDisconnect); so does this coroutine being cancelled."""
    cancel = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(decode_audio_file, data, "file", limits.max_audio_seconds, cancel))
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=HANGUP_POLL_S)
            if done:
                return work.result()
            if await request.is_disconnected():
                log.info(
                    "request %s: the client hung up while its upload was decoded; decoding stopped",
                    request.state.request_id,
                )
                raise ClientDisconnect()
    finally:
        cancel.set()  # whatever ended the wait ends the decode too (a no-op once it is done)
        if not work.done():
            work.add_done_callback(_drop_outcome)


def _drop_outcome(work: asyncio.Future[Any]) -> None:
    # The decode was given up on: its end (DecodeCancelled, or a result no one wants) is not news.
    if not work.cancelled():
        work.exception()


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def srt(segments: list[TranscriptSegment]) -> str:
    cues = [
        f"{i}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(cues)


def vtt(segments: list[TranscriptSegment]) -> str:
    cues = [f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text.strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues)


def _logprobs(segments: list[TranscriptSegment]) -> list[dict[str, Any]]:
    """Per word (faster-whisper gives a word's probability, the mean of its tokens')."""
    return [
        {"token": w.word, "logprob": math.log(max(w.probability, 1e-12)), "bytes": list(w.word.encode())}
        for s in segments
        for w in s.words
    ]


def _verbose(heard: Transcript, answer: Answer) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": answer.task,
        "language": heard.language or "",
        "duration": heard.duration,
        "text": heard.text,
    }
    body["segments"] = [
        {
            "id": s.id,
            "seek": int(s.start * 100),
            "start": s.start,
            "end": s.end,
            "text": s.text,
            "tokens": s.tokens,
            "temperature": s.temperature,
            "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio,
            "no_speech_prob": s.no_speech_prob,
        }
        for s in heard.segments
    ]
    if answer.words:
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in heard.segments for w in s.words]
    if answer.task == "transcribe":
        body["usage"] = {"type": "duration", "seconds": round(heard.duration, 3)}
    return body


def whole_answer(heard: Transcript, answer: Answer) -> Response:
    if answer.fmt == "text":
        return PlainTextResponse(heard.text)
    if answer.fmt in ("srt", "vtt"):
        write = srt if answer.fmt == "srt" else vtt
        return PlainTextResponse(write(heard.segments), media_type=_MEDIA[answer.fmt])
    if answer.fmt == "verbose_json":
        return JSONResponse(_verbose(heard, answer))
    body: dict[str, Any] = {"text": heard.text}
    if answer.task == "transcribe":
        body["usage"] = {"type": "duration", "seconds": round(heard.duration, 3)}
    if answer.logprobs:
        body["logprobs"] = _logprobs(heard.segments)
    return JSONResponse(body)


@dataclass(frozen=True)
class _Final:
    """The transcript terminal's result (what streamed before it were single segments)."""

    transcript: Transcript


async def _events(tracked: chat.Tracked) -> AsyncIterator[Transcript | _Final | chat.PipelineEvent]:
    """Each streamed segment, then the result; or the event that ended the request."""
    async for event in tracked.request.events():
        if event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
            yield event
            return
        if isinstance(event.data, Transcript):
            yield event.data if event.kind is RequestEventKind.STREAM else _Final(event.data)


def _refusal(tracked: chat.Tracked, event: chat.PipelineEvent) -> JSONResponse:
    outcome = chat.outcome_of(tracked, event)
    # the metrics' note: the stage's own words for bad input, with the stage named for a failure
    note = str(event.error) if isinstance(outcome, InvalidRequest) else str(outcome)
    chat.finish_with(tracked, outcome, None if isinstance(outcome, RequestAborted) else note)
    return outcome_response(outcome)


def _delta(segment: TranscriptSegment, first: bool, answer: Answer) -> bytes:
    event: dict[str, Any] = {"type": "transcript.text.delta", "delta": segment.text.lstrip() if first else segment.text}
    if answer.logprobs:
        event["logprobs"] = _logprobs([segment])
    return sse_event(event)


async def _sse(tracked: chat.Tracked, first: Any, rest: AsyncIterator[Any], answer: Answer) -> AsyncIterator[bytes]:
    """Deltas as segments arrive; at the result, the segments that had not streamed (the
    result may overtake the last chunks), then ``transcript.text.done``."""
    sent = 0  # segments sent as deltas, in order
    item = first
    while item is not None:
        if isinstance(item, _Final):
            heard = item.transcript
            for segment in heard.segments[sent:]:
                yield _delta(segment, sent == 0, answer)
                sent += 1
            tracked.saw_text()
            done: dict[str, Any] = {"type": "transcript.text.done", "text": heard.text}
            if answer.logprobs:
                done["logprobs"] = _logprobs(heard.segments)
            yield sse_event(done)
            tracked.finish("completed")
            return
        if not isinstance(item, Transcript):
            # an abort is the client's here: the stream names no server shutdown
            outcome = chat.outcome_of(tracked, item, shutdown=False)
            chat.finish_with(tracked, outcome, None if isinstance(outcome, RequestAborted) else str(item.error))
            yield outcome_event(outcome)
            return
        for segment in item.segments:
            if segment.id == sent:
                yield _delta(segment, sent == 0, answer)
                tracked.saw_text()
                sent += 1
        item = await anext(rest, None)
    tracked.finish("failed", "the transcript terminal ended without a result")
    yield sse_error("the recognizer ended without a result", "server_error", "stage_failed")


def endpoint(
    state: ServingState, task: str = "transcribe"
) -> Callable[[Request], Awaitable[Response | EventStreamResponse]]:
    path = TRANSCRIPTIONS if task == "transcribe" else TRANSLATIONS

    async def parse(request: Request, raw: bytes, pipe: PipelineLike) -> Submission[Answer]:
        inputs, answer, model = await parse_audio_form(request, raw, state.limits, task)
        return Submission(inputs, [TRANSCRIPT], model, answer)

    async def transcriptions(request: Request) -> Response | EventStreamResponse:
        admitted = await admit(state, request, parse, path, media_type="multipart/form-data")
        if not isinstance(admitted, Admitted):
            return admitted
        tracked, answer, abort = admitted.tracked, admitted.submission.extra, admitted.pipeline.abort
        if answer.stream:
            items = _events(tracked)
            here, first = await chat.first_item(items, request)
            if not here:
                await abort(tracked.request.id)
                tracked.finish("aborted")
                return Response(status_code=499)
            if first is not None and not isinstance(first, (Transcript, _Final)):
                return _refusal(tracked, first)

            async def on_disconnect() -> None:
                if tracked.outcome is None:
                    await abort(tracked.request.id)
                    tracked.finish("aborted")

            closing = sse_error("the server failed to send the transcript", "server_error", "internal_error")
            return EventStreamResponse(
                _sse(tracked, first, items, answer),
                on_disconnect,
                on_failure=chat.on_stream_failure(tracked, abort, closing),
            )
        outcome = await chat.results(tracked, request, abort)
        if isinstance(outcome, Response):
            return outcome
        heard = next((data for data in outcome.values() if isinstance(data, Transcript)), Transcript(text=""))
        tracked.saw_text()
        tracked.finish("completed")
        return whole_answer(heard, answer)

    return transcriptions
