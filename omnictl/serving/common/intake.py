"""Admitting one HTTP request into the pipeline: id, key, media type, body, parse, submit.

Every endpoint that runs the pipeline once per HTTP request (chat completions, speech,
transcriptions) goes through :func:`admit`, so they share one set of checks, error
responses and metrics: a request is either refused with a JSON error, or becomes a
:class:`~omnictl.serving.common.tracking.Tracked` request in the active table.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from omnictl.exceptions import AdmissionTimeout, InvalidRequest, Overloaded, PayloadTooLarge, PipelineDead
from omnictl.playback.admission import predict
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.common.capabilities import cannot_serve, capabilities
from omnictl.serving.common.errors import error_response, outcome_response
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.state import PipelineLike, ServingState

T = TypeVar("T")
log = logging.getLogger("omnictl.serving")


@dataclass(frozen=True)
class Submission(Generic[T]):
    """What a parser makes of a body: the pipeline's inputs, the modalities to run,
    and whatever else its endpoint needs to answer (``extra``)."""

    inputs: Any
    modalities: list[str]
    model: str
    extra: T
    audio_format: str = "wav"
    # the caller gets stream chunks as they come (SSE); False: only the final answer, so a
    # request that streamed internally can still be replayed after a replica died
    stream: bool = True


Parser = Callable[[Request, bytes, PipelineLike], Awaitable[Submission[T]]]


@dataclass(frozen=True)
class Admitted(Generic[T]):
    tracked: Tracked
    submission: Submission[T]
    pipeline: PipelineLike


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}", field="body")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes", field="body")
    return bytes(body)


async def read_body_in_time(request: Request, limits: Limits) -> bytes | None:
    """The body, or None when it did not arrive within ``limits.body_timeout_s``.
    Raises :class:`ClientDisconnect` when the client left before sending all of it."""
    try:
        return await asyncio.wait_for(read_body(request, limits.max_body_bytes), limits.body_timeout_s)
    except asyncio.TimeoutError:
        return None


def overloaded(state: ServingState, exc: Overloaded) -> Response:
    """Admission control's refusal: 429 at once over the limit, 503 after waiting too long."""
    waited = isinstance(exc, AdmissionTimeout)
    state.metrics.outcome("rejected")
    state.metrics.overloaded.labels("queue_timeout" if waited else "over_limit").inc()
    response = outcome_response(exc)
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


@dataclass(frozen=True)
class UnderrunRefusal:
    """Why a new audio stream is refused now (``--max-underrun-ms``) and when to retry."""

    message: str
    retry_after_s: int


def underrun_refusal(state: ServingState, modalities: list[str]) -> UnderrunRefusal | None:
    """Whether a new audio request is refused because admitting it is predicted to make a
    playing stream underrun by more than ``--max-underrun-ms`` (see
    :mod:`omnictl.playback.admission`); None to admit it. Requests without audio are never
    held by this. A refusal is counted; each endpoint answers it in its own protocol."""
    if state.max_underrun_ms is None or "audio" not in modalities:
        return None
    clocks = [t.playback for t in state.active.values() if t.playback is not None and t.outcome is None]
    prediction = predict(clocks, time.perf_counter())
    if prediction.underrun_s * 1000 <= state.max_underrun_ms:
        return None
    state.metrics.outcome("rejected")
    state.metrics.overloaded.labels("underrun").inc()
    return UnderrunRefusal(
        f"a new audio stream now would make one of the {prediction.streams} playing underrun by "
        f"{prediction.underrun_s * 1000:.0f} ms (--max-underrun-ms {state.max_underrun_ms:g}); retry later",
        max(1, math.ceil(prediction.retry_after_s)),
    )


def would_underrun(state: ServingState, modalities: list[str]) -> Response | None:
    """429 with Retry-After for a new audio request :func:`underrun_refusal` refuses."""
    refusal = underrun_refusal(state, modalities)
    if refusal is None:
        return None
    response = error_response(429, refusal.message, "rate_limit_error", "audio_underrun")
    response.headers["Retry-After"] = str(refusal.retry_after_s)
    return response


def unresponsive(processes: list[str]) -> Response:
    """503 naming the stage processes that are up but do not answer (frozen, stuck): a
    request sent there would hang until --request-timeout and hold a slot meanwhile."""
    names = ", ".join(repr(p) for p in processes)
    response = error_response(
        503, f"stage process {names} is not responding (see /health); retry later", "server_error", "stage_unresponsive"
    )
    response.headers["Retry-After"] = "2"
    return response


async def admit(
    state: ServingState,
    request: Request,
    parse: Parser[T],
    endpoint: str | None = None,
    media_type: str = "application/json",
) -> Admitted[T] | Response:
    """Check, parse and submit; a refusal is a Response. ``endpoint``: the capability it
    needs; ``media_type``: the Content-Type its body must have."""
    request_id: str = request.state.request_id
    if request.state.bad_request_id:
        return error_response(
            400,
            "X-Request-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -",
            "invalid_request_error",
            "invalid_request",
            "X-Request-Id",
        )
    sent_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if sent_type != media_type:
        # A web page may POST text/plain cross-origin without a preflight; refusing it
        # keeps a key-less server on localhost out of any browser tab's reach.
        state.metrics.outcome("rejected")
        return error_response(
            415,
            f"Content-Type must be {media_type}, got {sent_type or 'none'!r}",
            "invalid_request_error",
            "unsupported_media_type",
            "Content-Type",
        )
    if state.pipeline is not None and state.unresponsive:
        state.metrics.outcome("rejected")
        return unresponsive(state.unresponsive)
    if state.pipeline is not None:
        refused = state.pipeline.admission.refusal()  # before reading the body: a cheap 429
        if refused is not None:
            return overloaded(state, refused)
    try:
        try:
            raw = await read_body_in_time(request, state.limits)
        except ClientDisconnect:
            # The client closed mid-body: no one to answer, nothing to log but a line (it
            # was a Starlette traceback per connection).
            state.metrics.outcome("rejected")
            log.info("the client disconnected before sending its whole request body")
            return Response(status_code=400)
        if raw is None:
            state.metrics.outcome("rejected")
            return error_response(
                408,
                f"the request body did not arrive within {state.limits.body_timeout_s:g} s",
                "invalid_request_error",
                "request_timeout",
                "body",
            )
        pipe = state.pipeline
        if pipe is None:
            return error_response(503, "the pipeline is still starting; retry shortly", "server_error", "starting")
        if endpoint is not None and endpoint not in capabilities(pipe.topology).endpoints():
            state.metrics.outcome("rejected")
            return error_response(
                404, cannot_serve(pipe.topology, endpoint), "invalid_request_error", "unsupported_endpoint"
            )
        submission = await parse(request, raw, pipe)
        held = would_underrun(state, submission.modalities)
        if held is not None:
            return held
        served = (state.model_name, *state.aliases)
        if submission.model and submission.model not in served:
            state.metrics.outcome("rejected")
            return error_response(
                404,
                f"the model {submission.model!r} does not exist; this server serves "
                f"{', '.join(repr(m) for m in served)}",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        try:
            submitted = await pipe.submit(
                submission.inputs,
                submission.modalities,
                request_id=request_id,
                traceparent=state.traceparent(request.headers),
                stream=submission.stream,
            )
        except InvalidRequest as exc:
            if exc.field != "request_id":
                raise
            # The coordinator refuses an id it has seen: stages drop late messages of
            # finished ids, and ids key the trace store.
            state.metrics.outcome("rejected")
            return error_response(
                409,
                f"request id {request_id!r} was already used",
                "invalid_request_error",
                "duplicate_request_id",
                "X-Request-Id",
            )
    except InvalidRequest as exc:
        state.metrics.outcome("rejected")
        return outcome_response(exc)
    except ClientDisconnect:  # it hung up while its body was parsed (an upload decoded): it said why
        state.metrics.outcome("rejected")
        return Response(status_code=400)
    except PipelineDead as exc:
        state.metrics.outcome("rejected")
        return outcome_response(exc, f"the pipeline is down: {exc}")
    except Overloaded as exc:
        return overloaded(state, exc)
    state.metrics.in_flight.inc()
    tracked = Tracked(
        submitted, state.metrics, state.active, submission.model or state.model_name, submission.audio_format
    )
    tracked.profiler = state.profiler
    state.active[submitted.id] = tracked
    return Admitted(tracked, submission, pipe)
