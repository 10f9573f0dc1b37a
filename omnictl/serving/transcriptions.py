"""``POST /v1/audio/transcriptions`` (OpenAI speech to text): speech recognition only.

Multipart fields ``file`` (a WAV file), ``model``, ``language`` and ``response_format``
(``json`` | ``text`` | ``verbose_json``). The pipeline gets a one-message chat request
holding the audio, for the ``transcript`` modality alone: modality pruning runs only
the stages that lead to the topology's ``transcript`` terminal (the voice assistant:
preprocessing and asr; no LLM, no speech).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Message

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.inputs import parse_request, read_wav
from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.serving import chat
from omnictl.serving.admission import Admitted, Submission, admit
from omnictl.serving.errors import field_error
from omnictl.serving.protocol import Limits
from omnictl.serving.state import PipelineLike, ServingState

ENDPOINT = "/v1/audio/transcriptions"
FORMATS = ("json", "text", "verbose_json")
_FIELDS = {"file", "model", "language", "response_format", "temperature", "stream"}


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
        return await Request(request.scope, replay).form(max_files=1, max_fields=16)
    except (MultiPartException, ValueError) as exc:
        raise field_error("body", f"is not a readable multipart form ({exc})") from exc
    except HTTPException as exc:  # what Starlette makes of a MultiPartException inside an app: plain text, not our JSON
        raise field_error("body", f"is not a readable multipart form ({exc.detail})") from exc


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is not None and not isinstance(value, str):
        raise field_error(name, "must be a plain form field")
    return value


async def parse_transcription(request: Request, raw: bytes, limits: Limits) -> tuple[Any, str, str]:
    """(the pipeline's inputs, response_format, model) of a multipart body."""
    form = await _form(request, raw)
    for key in form.keys():
        if key not in _FIELDS:
            raise field_error(key, f"is not supported (this endpoint reads {', '.join(sorted(_FIELDS))})")
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise field_error("file", "is missing: send the audio as a file field")
    data = await upload.read()
    if len(data) > limits.max_audio_bytes:
        raise PayloadTooLarge(f"'file' is {len(data)} bytes; the limit is {limits.max_audio_bytes}", field="file")
    samples, rate = read_wav(data, "file")  # InvalidRequest naming 'file' for anything but WAV
    fmt = _field(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise field_error("response_format", f"{fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    if (_field(form, "stream") or "false").lower() != "false":
        raise field_error("stream", "is not supported: the transcript comes whole")
    temperature = _field(form, "temperature")
    if temperature not in (None, "0", "0.0"):
        raise field_error("temperature", "is not supported: recognition is greedy (0)")
    language = _field(form, "language") or None
    audio = {"type": "input_audio", "input_audio": {"data": samples, "sample_rate": rate}}
    request_inputs: dict[str, Any] = {"messages": [{"role": "user", "content": [audio]}]}
    if language is not None:
        request_inputs["language"] = language
    try:
        inputs = parse_request(request_inputs, max_audio_seconds=limits.max_audio_seconds)
    except InvalidRequest as exc:  # name the form's field, not the internal message's
        field = "language" if exc.field == "language" else "file"
        raise field_error(field, str(exc).split(": ", 1)[-1]) from exc
    return inputs, fmt, _field(form, "model") or ""


def endpoint(state: ServingState) -> Callable[[Request], Awaitable[Response]]:
    async def parse(request: Request, raw: bytes, pipe: PipelineLike) -> Submission[str]:
        inputs, fmt, model = await parse_transcription(request, raw, state.limits)
        return Submission(inputs, [TRANSCRIPT], model, fmt)

    async def transcriptions(request: Request) -> Response:
        admitted = await admit(state, request, parse, ENDPOINT, media_type="multipart/form-data")
        if not isinstance(admitted, Admitted):
            return admitted
        tracked = admitted.tracked
        outcome = await chat.results(tracked, request, admitted.pipeline.abort)
        if isinstance(outcome, Response):
            return outcome
        heard = next((data for data in outcome.values() if isinstance(data, Transcript)), Transcript(text=""))
        tracked.saw_text()
        tracked.finish("completed")
        fmt = admitted.submission.extra
        if fmt == "text":
            return PlainTextResponse(heard.text)
        usage = {"type": "duration", "seconds": round(heard.duration, 3)}
        if fmt == "json":
            return JSONResponse({"text": heard.text, "usage": usage})
        return JSONResponse({"task": "transcribe", "language": heard.language or "", "duration": heard.duration,
                             "text": heard.text, "segments": [], "usage": usage})

    return transcriptions
