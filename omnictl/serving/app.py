"""The Starlette application: routes, request ids, auth, body limits, error mapping."""

from __future__ import annotations

import dataclasses
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnictl.exceptions import InvalidRequest, PayloadTooLarge, PipelineDead
from omnictl.serving import chat
from omnictl.serving.auth import authorized
from omnictl.serving.metrics import CONTENT_TYPE, ServerMetrics
from omnictl.serving.protocol import Limits, parse_chat_body
from omnictl.serving.sse import error_body

REQUEST_ID_HEADER = "X-Request-Id"
_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class PipelineLike(Protocol):
    """What the server needs from :class:`omnictl.Pipeline`."""

    @property
    def topology(self) -> Any: ...

    @property
    def healthy(self) -> bool: ...

    def health(self) -> tuple[str, dict[str, str]]: ...

    def nodes(self) -> dict[str, dict[str, Any]]: ...

    run_dir: Any

    async def submit(self, inputs: Any, modalities: list[str] | None = None, request_id: str | None = None) -> Any: ...

    async def abort(self, request_id: str) -> Any: ...

    async def stats(self) -> dict[str, dict[str, Any]]: ...

    def in_flight(self) -> int: ...

    def process_ids(self) -> dict[str, int]: ...


@dataclass
class ServingState:
    """Shared between the launcher (which sets ``pipeline`` once ready) and the routes."""

    model_name: str  # the topology's `name`: the model id clients ask for
    pipeline: PipelineLike | None = None
    aliases: tuple[str, ...] = ()  # other model ids accepted (`--served-model-name`)
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    active: dict[str, chat.Tracked] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))


def new_request_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


class RequestIdMiddleware:
    """Gives every request an id (the client's ``X-Request-Id`` or a new one) and echoes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = presented if _ID_PATTERN.match(presented) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        scope["state"]["bad_request_id"] = bool(presented) and request_id != presented

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message["headers"] = headers + [(b"x-request-id", request_id.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _error(status: int, message: str, kind: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=status)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}", field="body")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes", field="body")
    return bytes(body)


def _invalid(exc: InvalidRequest) -> JSONResponse:
    status = 413 if isinstance(exc, PayloadTooLarge) else 400
    code = "payload_too_large" if status == 413 else "invalid_request"
    return _error(status, str(exc), "invalid_request_error", code, exc.field)


def create_app(state: ServingState) -> Starlette:
    def pipeline_or_none() -> PipelineLike | None:
        return state.pipeline

    async def chat_completions(request: Request) -> Response | chat.EventStreamResponse:
        request_id: str = request.state.request_id
        if request.state.bad_request_id:
            return _error(400, "X-Request-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -", "invalid_request_error", "invalid_request", "X-Request-Id")
        if not authorized(request.headers, state.api_key):
            state.metrics.outcome("rejected")
            return _error(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error", "invalid_api_key")
        try:
            raw = await _read_body(request, state.limits.max_body_bytes)
            pipe = pipeline_or_none()
            if pipe is None:
                return _error(503, "the pipeline is still starting; retry shortly", "server_error", "starting")
            # JSON, envelope and messages; input audio is decoded here, once (off the loop when large)
            parsed = await parse_chat_body(raw, pipe.topology.terminals, state.limits)
            served = (state.model_name, *state.aliases)
            if parsed.model and parsed.model not in served:
                state.metrics.outcome("rejected")
                return _error(404, f"the model {parsed.model!r} does not exist; this server serves "
                              f"{', '.join(repr(m) for m in served)}", "invalid_request_error", "model_not_found", "model")
            parsed = dataclasses.replace(parsed, model=parsed.model or state.model_name)
            try:
                submitted = await pipe.submit(parsed.inputs, parsed.modalities, request_id=request_id)
            except InvalidRequest as exc:
                if exc.field != "request_id":
                    raise
                # The coordinator refuses an id it has seen: stages drop late messages of
                # finished ids, and ids key the trace store.
                state.metrics.outcome("rejected")
                return _error(409, f"request id {request_id!r} was already used", "invalid_request_error",
                              "duplicate_request_id", "X-Request-Id")
        except InvalidRequest as exc:
            state.metrics.outcome("rejected")
            return _invalid(exc)
        except PipelineDead as exc:
            state.metrics.outcome("rejected")
            return _error(503, f"the pipeline is down: {exc}", "server_error", "pipeline_dead")
        state.metrics.in_flight.inc()
        tracked = chat.Tracked(submitted, parsed, state.metrics, state.active)
        state.active[submitted.id] = tracked
        if parsed.stream:
            return chat.stream_response(tracked, pipe.abort)
        return await chat.complete(tracked, request, pipe.abort)

    async def abort_request(request: Request) -> Response:
        if not authorized(request.headers, state.api_key):
            return _error(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
        target = request.path_params["request_id"]
        pipe = pipeline_or_none()
        if pipe is None or target not in state.active:
            return _error(404, f"no request {target!r} is in flight", "invalid_request_error", "not_found")
        await pipe.abort(target)
        return JSONResponse({"id": target, "status": "aborting"})

    async def models(request: Request) -> Response:
        if not authorized(request.headers, state.api_key):
            return _error(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
        models = [{"id": name, "object": "model", "created": state.created, "owned_by": "omnictl"}
                  for name in (state.model_name, *state.aliases)]
        return JSONResponse({"object": "list", "data": models})

    async def health(request: Request) -> Response:
        pipe = pipeline_or_none()
        if pipe is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        stages = await pipe.stats()
        status, replicas_down = pipe.health()
        body = {
            # ok; degraded (200): some replica is down, every process still has one up;
            # down (503): some process has no replica up
            "status": status,
            "down": sorted(name for name, info in stages.items() if info.get("status") == "down"),
            "replicas_down": replicas_down,  # OS process (``tts#1``) -> why
            "processes": pipe.process_ids(),  # OS process -> pid
            "in_flight": len(state.active),  # requests this server is answering
            "pipeline_in_flight": pipe.in_flight(),  # requests the coordinator still tracks
            "stages": stages,  # per stage: status and the state it holds (queued, running, buffers)
            "nodes": pipe.nodes(),  # per node label ("-": the coordinator's machine): status, processes
            # where the profiler writes traces: `omnictl trace` and a local bench read it
            "run_dir": str(pipe.run_dir) if pipe.run_dir is not None else None,
        }
        return JSONResponse(body, status_code=503 if body["status"] == "down" else 200)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/requests/{request_id}/abort", abort_request, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(RequestIdMiddleware)
    return app

