"""``POST /v1/chat/completions``: one request through the pipeline, streamed or not.

Every request ends in exactly one outcome (completed, failed, aborted) that the
metrics count once, and leaves the active table whichever way it ended, so an
abort from a disconnecting client and the pipeline's own aborted event never
double-count or leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnictl.exceptions import InvalidRequest, RequestAborted, RequestFailed
from omnictl.outputs import AudioChunk, TextDelta, TextResult
from omnictl.playback.continuity import PlaybackClock
from omnictl.profiler import EventKind, NullProfiler, Profiler
from omnictl.request import RequestEventKind
from omnictl.serving.common.errors import ended, outcome_event, outcome_response
from omnictl.serving.common.eventstream import EventStreamResponse

__all__ = ["EventStreamResponse", "Tracked", "complete", "end_in_flight", "results", "stream_response"]
from omnictl.serving.chat.responses import ChunkTranslator, build_completion
from omnictl.serving.chat.sse import DONE, sse_error, sse_event
from omnictl.serving.common.metrics import ServerMetrics

__all__ = ["EventStreamResponse", "Tracked", "complete", "results", "stream_response"]

Abort = Callable[[str], Awaitable[Any]]
log = logging.getLogger(__name__)


class PipelineEvent(Protocol):
    kind: RequestEventKind
    stage: str | None
    data: Any
    error: Any
    field: str | None
    at_ns: int  # when the coordinator had it (monotonic ns)


class PipelineRequest(Protocol):
    id: str

    def events(self) -> AsyncIterator[PipelineEvent]: ...


@dataclass
class Tracked:
    """One admitted request: its timings and its single outcome."""

    request: PipelineRequest
    metrics: ServerMetrics
    active: dict[str, Tracked]
    model: str = ""
    audio_format: str = "wav"
    started: float = field(default_factory=time.perf_counter)
    first_text: float | None = None
    first_audio: float | None = None
    outcome: str | None = None
    # Set when the server ends the request itself (shutting down): the client is told why.
    ended_by_server: str | None = None
    # A streamed response's audio as a listener hears it (set by :meth:`plays`); None for
    # answers sent whole, which have no playback to keep up with.
    playback: PlaybackClock | None = None
    endpoint: str = ""
    profiler: Profiler = field(default_factory=NullProfiler)  # where an underrun is recorded

    def plays(self, endpoint: str) -> None:
        """This request's audio leaves as a stream, on ``endpoint``: keep its playback clock."""
        self.playback = PlaybackClock(self.started)
        self.endpoint = endpoint

    def arrived_now(self) -> None:
        """The client's request for it arrives now, after its submission: a held preemptive
        answer (realtime), submitted at a pause in speech and asked for when the turn is
        confirmed. Its time to first text and audio, and its playback's TTFP and RTF, count
        from here, not through the hold; nothing of it was seen before."""
        self.started = time.perf_counter()
        if self.playback is not None:
            self.playback.start = self.started

    def saw_text(self) -> None:
        if self.first_text is None:
            self.first_text = time.perf_counter() - self.started
            self.metrics.first_text.observe(self.first_text)

    def saw_audio(self) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter() - self.started
            self.metrics.first_audio.observe(self.first_audio)

    def saw(self, data: object) -> None:
        """Note the first text and the first audio of a terminal's output."""
        if isinstance(data, (TextDelta, TextResult)) and data.text:
            self.saw_text()
        elif isinstance(data, AudioChunk):
            self.saw_audio()
            if self.playback is not None:
                gap = self.playback.chunk(time.perf_counter(), data.samples.size / data.sample_rate)
                if gap > 0:  # marked on the request's timeline: `omnictl trace` shows it
                    chunk = self.playback.chunks - 1
                    self.profiler.record(
                        EventKind.UNDERRUN, self.request.id, seconds=gap, chunk=chunk, endpoint=self.endpoint
                    )

    def finish(self, outcome: str, why: str | None = None, logged: bool = False) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        if outcome == "failed" and not logged:  # logged once, here: the request id, and where and why
            log.warning(
                "request %s failed: %s",
                self.request.id,
                why or "(no reason given)",
                extra={"request_id": self.request.id},
            )
        self.metrics.outcome(outcome)
        self.metrics.in_flight.dec()
        if outcome == "completed":
            self.metrics.e2e.observe(time.perf_counter() - self.started)
        if self.playback is not None:  # an aborted stream's gaps were heard too
            self.metrics.audio.observe(self.model, self.endpoint, self.playback.report())
        self.active.pop(self.request.id, None)


def error_of(event: PipelineEvent) -> str:
    """An error event's message, naming its stage once."""
    return _error_of(event)


def outcome_of(
    tracked: Tracked, event: PipelineEvent, field: Callable[[str], str] | None = None, *, shutdown: bool = True
) -> Exception:
    """The outcome an ERROR or ABORTED event ends ``tracked`` with (errors.OUTCOMES maps it
    to a status and code). ``field``: how the endpoint's body names a field a stage named;
    ``shutdown``: whether an abort by a stopping server is told apart from the client's."""
    if event.kind is RequestEventKind.ERROR:
        named = None if event.field is None else (field(event.field) if field else event.field)
        return ended(tracked.request.id, error=_error_of(event), field=named, ended_by_server=None)
    return ended(
        tracked.request.id, error=None, field=None, ended_by_server=tracked.ended_by_server if shutdown else None
    )


def finish_with(tracked: Tracked, outcome: Exception, message: str | None = None) -> None:
    """Count ``outcome`` in the metrics: the client's bad input is rejected, a stage's failure
    failed, the rest (the client, or the server stopping) aborted."""
    if isinstance(outcome, InvalidRequest):
        tracked.finish("rejected", message)
    elif isinstance(outcome, RequestFailed):
        tracked.finish("failed", message)
    else:
        tracked.finish("aborted", message)


def _error_of(event: PipelineEvent) -> str:
    message = str(event.error)
    if event.stage and event.stage not in message:
        return f"stage {event.stage!r}: {message}"
    return message


def client_field(field: str) -> str:
    """A field a stage named, as the chat body names it: the request's ``sampling.top_k``
    came as the body's ``top_k`` (the HTTP layer maps OpenAI's names onto the sampling type)."""
    return field.removeprefix("sampling.")


async def stream_chunks(tracked: Tracked, translator: ChunkTranslator) -> AsyncIterator[bytes]:
    """The SSE body: a role chunk, deltas as they come, a usage chunk, ``[DONE]``."""
    yield sse_event(translator.first())
    async for event in tracked.request.events():
        if event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
            outcome = outcome_of(tracked, event, client_field)
            finish_with(
                tracked, outcome, None if isinstance(outcome, (InvalidRequest, RequestAborted)) else str(outcome)
            )
            yield outcome_event(outcome)
            break
        stage = event.stage or ""
        if event.kind is RequestEventKind.STREAM:
            chunks = translator.on_stream(stage, event.data)
        else:
            chunks = translator.on_result(stage, event.data)
        for chunk in chunks:
            yield sse_event(chunk)
        if chunks:
            # after the bytes were handed on (the body's consumer asks for the next chunk once
            # its send returned): the listener's clock starts when audio leaves, not when it
            # was ready; encoding a chunk of seconds of audio takes tens of ms on a busy core
            tracked.saw(event.data)
    else:
        for chunk in translator.tail():
            yield sse_event(chunk)
        yield sse_event(translator.last())
        tracked.finish("completed")
    yield DONE


async def _collect(tracked: Tracked) -> dict[str, object] | Exception:
    """Every terminal's result, or the outcome that ended the request before it completed."""
    results: dict[str, object] = {}
    async for event in tracked.request.events():
        if event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
            return outcome_of(tracked, event, client_field)
        tracked.saw(event.data)
        if event.kind is RequestEventKind.RESULT and event.stage:
            results[event.stage] = event.data
    return results


async def end_in_flight(active: dict[str, Tracked], abort: Abort, reason: str) -> None:
    """End every open request with ``reason``: a stream gets an error event and ``[DONE]``,
    a waiting client a 503, instead of a connection cut when the server stops."""
    for tracked in list(active.values()):
        tracked.ended_by_server = reason
        await abort(tracked.request.id)


async def client_left(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first_item(items: AsyncIterator[Any], request: Request) -> tuple[bool, Any]:
    """(client still here, the first item of ``items`` or None when there is none). A
    streamed answer waits for it before its status line, so that a request refused
    before any output still gets a JSON error status instead of a 200."""
    first = asyncio.ensure_future(anext(items, None))
    watch = asyncio.ensure_future(client_left(request))
    await asyncio.wait({first, watch}, return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    if not first.done():
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await first
        return False, None
    return True, first.result()


async def results(tracked: Tracked, request: Request, abort: Abort) -> dict[str, object] | Response:
    """Every terminal's result, or the error response that ends the request (the request
    is finished then); a client that leaves while waiting aborts the request."""
    work = asyncio.create_task(_collect(tracked))
    watch = asyncio.create_task(client_left(request))
    await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        await abort(tracked.request.id)
        tracked.finish("aborted")
        return Response(status_code=499)  # nobody reads it: the client has gone
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    outcome = work.result()
    if isinstance(outcome, Exception):
        finish_with(tracked, outcome, str(outcome))
        return outcome_response(outcome)
    return outcome


async def complete(tracked: Tracked, request: Request, abort: Abort) -> Response:
    """The non-streamed response."""
    outcome = await results(tracked, request, abort)
    if isinstance(outcome, Response):
        return outcome
    body = build_completion(tracked.request.id, tracked.model, outcome, tracked.audio_format)
    tracked.finish("completed")
    return JSONResponse(body)


def stream_response(tracked: Tracked, abort: Abort) -> EventStreamResponse:
    tracked.plays("/v1/chat/completions")
    translator = ChunkTranslator(tracked.request.id, tracked.model, tracked.audio_format)

    async def on_disconnect() -> None:
        if tracked.outcome is None:
            await abort(tracked.request.id)
            tracked.finish("aborted")

    closing = sse_error("the server failed to send the response", "server_error", "internal_error") + DONE
    return EventStreamResponse(
        stream_chunks(tracked, translator), on_disconnect, on_failure=on_stream_failure(tracked, abort, closing)
    )


def on_stream_failure(tracked: Tracked, abort: Abort, closing: bytes) -> Callable[[BaseException], Awaitable[bytes]]:
    """What a streamed response does when producing its body raised: log it once, with the
    request id, end the request everywhere (it leaves the tables), and close the body with
    ``closing`` (an error event where the format has one)."""

    async def on_failure(exc: BaseException) -> bytes:
        log.error(
            "request %s failed: producing its stream raised %s",
            tracked.request.id,
            type(exc).__name__,
            exc_info=exc,
            extra={"request_id": tracked.request.id},
        )
        if tracked.outcome is None:
            await abort(tracked.request.id)
            tracked.finish("failed", logged=True)
        return closing

    return on_failure
