"""``POST /v1/chat/completions``: one request through the pipeline, streamed or not.

Every request ends in exactly one outcome (completed, failed, aborted) that the
metrics count once, and leaves the active table whichever way it ended, so an
abort from a disconnecting client and the pipeline's own aborted event never
double-count or leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnictl.serving.eventstream import EventStreamResponse

__all__ = ["EventStreamResponse", "Tracked", "complete", "stream_response"]
from omnictl.serving.metrics import ServerMetrics
from omnictl.serving.protocol import ChatRequest
from omnictl.serving.responses import ChunkTranslator, build_completion
from omnictl.serving.sse import DONE, error_body, sse_error, sse_event


# what a terminal that breaks the output convention makes the encoders raise
BAD_STAGE_OUTPUT = (KeyError, TypeError, ValueError)
Abort = Callable[[str], Awaitable[Any]]


class PipelineEvent(Protocol):
    kind: str  # "stream" | "result" | "error" | "aborted"
    stage: str | None
    data: Any
    error: Any


class PipelineRequest(Protocol):
    id: str

    def events(self) -> AsyncIterator[PipelineEvent]: ...


@dataclass
class Tracked:
    """One admitted request: its timings and its single outcome."""

    request: PipelineRequest
    chat: ChatRequest
    metrics: ServerMetrics
    active: dict[str, "Tracked"]
    started: float = field(default_factory=time.perf_counter)
    first_text: float | None = None
    first_audio: float | None = None
    outcome: str | None = None

    def saw_text(self) -> None:
        if self.first_text is None:
            self.first_text = time.perf_counter() - self.started
            self.metrics.first_text.observe(self.first_text)

    def saw_audio(self) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter() - self.started
            self.metrics.first_audio.observe(self.first_audio)

    def saw(self, chunk: dict[str, Any]) -> None:
        delta = chunk["choices"][0]["delta"]
        if delta.get("content"):
            self.saw_text()
        if "audio" in delta:
            self.saw_audio()

    def finish(self, outcome: str) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.metrics.outcome(outcome)
        self.metrics.in_flight.dec()
        if outcome == "completed":
            self.metrics.e2e.observe(time.perf_counter() - self.started)
        self.active.pop(self.request.id, None)


def _error_of(event: PipelineEvent) -> str:
    message = str(event.error)
    if event.stage and event.stage not in message:
        return f"stage {event.stage!r}: {message}"
    return message


async def stream_chunks(tracked: Tracked, translator: ChunkTranslator, abort: Abort) -> AsyncIterator[bytes]:
    """The SSE body: a role chunk, deltas as they come, a usage chunk, ``[DONE]``."""
    yield sse_event(translator.first())
    try:
        async for event in tracked.request.events():
            if event.kind == "error":
                tracked.finish("failed")
                yield sse_error(_error_of(event), "server_error", "stage_failed")
                break
            if event.kind == "aborted":
                tracked.finish("aborted")
                yield sse_error("the request was aborted", "server_error", "aborted")
                break
            stage = event.stage or ""
            chunks = translator.on_stream(stage, event.data) if event.kind == "stream" else translator.on_result(stage, event.data)
            for chunk in chunks:
                tracked.saw(chunk)
                yield sse_event(chunk)
        else:
            yield sse_event(translator.last())
            tracked.finish("completed")
        yield DONE
    except BAD_STAGE_OUTPUT as exc:
        # a stage broke the terminal convention (audio that is not a waveform, no
        # sample_rate): end the stream with an error event, never a silently cut connection
        tracked.finish("failed")
        await abort(tracked.request.id)  # the other terminals may still be working on it
        yield sse_error(f"a terminal's output could not be sent: {type(exc).__name__}: {exc}", "server_error", "bad_stage_output")
        yield DONE


async def _collect(tracked: Tracked, produces: dict[str, str]) -> dict[str, dict[str, Any]] | tuple[int, str, str]:
    """Every terminal's result, or (status, message, code) when the request did not complete."""
    results: dict[str, dict[str, Any]] = {}
    async for event in tracked.request.events():
        if event.kind == "error":
            return 500, _error_of(event), "stage_failed"
        if event.kind == "aborted":
            return 409, "the request was aborted", "aborted"
        modality = produces.get(event.stage or "")
        if event.kind in ("stream", "result") and modality == "audio":
            tracked.saw_audio()
        elif event.kind in ("stream", "result"):
            tracked.saw_text()
        if event.kind == "result" and event.stage:
            results[event.stage] = event.data
    return results


async def _client_left(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def complete(tracked: Tracked, produces: dict[str, str], request: Request, abort: Abort) -> Response:
    """The non-streamed response; a client that leaves while waiting aborts the request."""
    work = asyncio.create_task(_collect(tracked, produces))
    watch = asyncio.create_task(_client_left(request))
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
    if isinstance(outcome, tuple):
        status, message, code = outcome
        tracked.finish("failed" if code == "stage_failed" else "aborted")
        return JSONResponse(error_body(message, "server_error", code), status_code=status)
    try:
        body = build_completion(tracked.request.id, tracked.chat.model, produces, outcome, tracked.chat.audio_format)
    except BAD_STAGE_OUTPUT as exc:
        tracked.finish("failed")
        message = f"a terminal's output could not be sent: {type(exc).__name__}: {exc}"
        return JSONResponse(error_body(message, "server_error", "bad_stage_output"), status_code=500)
    tracked.finish("completed")
    return JSONResponse(body)


def stream_response(tracked: Tracked, produces: dict[str, str], abort: Abort) -> EventStreamResponse:
    translator = ChunkTranslator(tracked.request.id, tracked.chat.model, produces, tracked.chat.audio_format)

    async def on_disconnect() -> None:
        if tracked.outcome is None:
            await abort(tracked.request.id)
            tracked.finish("aborted")

    return EventStreamResponse(stream_chunks(tracked, translator, abort), on_disconnect)
