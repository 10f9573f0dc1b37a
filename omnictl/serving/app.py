"""The Starlette application: routes, request ids, auth, body limits, error mapping."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnictl.logs import request_scope
from omnictl.serving import playground
from omnictl.serving.chat import route as chat
from omnictl.serving.common.auth import HttpEndpoint, key_presented, requires_key, requires_key_socket
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.errors import error_response
from omnictl.serving.common.guard import GuardMiddleware, RequestGuard
from omnictl.serving.common.metrics import CONTENT_TYPE
from omnictl.serving.realtime.calls import webrtc_calls
from omnictl.serving.realtime.channel import RealtimeHub
from omnictl.serving.realtime.route import realtime_endpoint
from omnictl.serving.speech import route as speech
from omnictl.serving.speech import voices
from omnictl.serving.state import PipelineLike, ServingState
from omnictl.serving.transcriptions import route as transcriptions

__all__ = ["PipelineLike", "RequestIdMiddleware", "ServingState", "create_app", "new_request_id"]

REQUEST_ID_HEADER = "X-Request-Id"
HEALTH_STATS_TIMEOUT_S = 2.0  # a live stage process answers in milliseconds
LIVENESS_EVERY_S = 1.0
log = logging.getLogger("omnictl.serving")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def unresponsive_processes(stages: dict[str, dict[str, Any]]) -> list[str]:
    """OS processes (``tts#1`` for a replica) whose stages did not answer the stats request."""
    names: set[str] = set()
    for info in stages.values():
        replicas = info.get("replicas")
        if replicas:
            names.update(name for name, replica in replicas.items() if replica.get("status") == "unknown")
        elif info.get("status") == "unknown":
            names.add(info["process"])
    return sorted(names)


BUSY_STEP_S = 5.0  # a stage in one compute step this long is listed in /health's `busy`


def note_unresponsive(state: ServingState, pipe: PipelineLike, unresponsive: list[str]) -> None:
    """New requests avoid the replicas that do not answer; ``state.unresponsive`` (what
    admission refuses at once) keeps the processes none of whose replicas answer."""
    avoid = getattr(pipe, "avoid", None)  # a test double of the pipeline may not have it
    if avoid is not None:
        avoid(unresponsive)
    frozen = set(unresponsive)
    processes = getattr(pipe.topology, "processes", {})
    state.unresponsive = sorted(
        name for name, process in processes.items() if process.instances and all(i in frozen for i in process.instances)
    )


async def watch_liveness(state: ServingState, every_s: float = LIVENESS_EVERY_S) -> None:
    """Ask every stage process for its stats each ``every_s``; the ones that do not answer
    within HEALTH_STATS_TIMEOUT_S are ``state.unresponsive``, which admission refuses
    (fast 503) until they answer again. Runs until cancelled."""
    while True:
        pipe = state.pipeline
        if pipe is not None:
            try:
                stages = await pipe.stats(HEALTH_STATS_TIMEOUT_S)
                note_unresponsive(state, pipe, unresponsive_processes(stages))
                note_busy(state, stages)
            except Exception:
                log.debug("liveness check failed", exc_info=True)
        await asyncio.sleep(every_s)


def note_busy(state: ServingState, stages: dict[str, dict[str, Any]]) -> None:
    """``omnictl_stage_busy_seconds`` of each stage from its stats (0 for one that did not say)."""
    for name, info in stages.items():
        state.metrics.stage_busy.labels(name).set(float(info.get("busy_s", 0.0)))


def busy_stages(stages: dict[str, dict[str, Any]], threshold: float = BUSY_STEP_S) -> dict[str, float]:
    """Stages inside one compute step (one model call) for ``threshold`` seconds or more.

    Such a stage still answers (its IO loop is free), so it is not `unresponsive`; but a
    step that long (a huge prefill, a stuck model call) holds up every request there."""
    return {name: info["busy_s"] for name, info in stages.items() if info.get("busy_s", 0.0) >= threshold}


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

        with request_scope(request_id):  # every record logged while serving it carries its id
            await self.app(scope, receive, send_with_id)


def create_app(state: ServingState, guard: RequestGuard | None = None) -> Starlette:
    """The app; ``guard``: the Host / Origin checks (None: the defaults for a loopback server)."""

    realtime = RealtimeHub(state)  # WebSocket sessions and WebRTC calls: one count, one session core
    calls = webrtc_calls(realtime)  # a 501 naming what to install when aiortc is missing
    state.on_stop.append(calls.close_all)

    async def abort_request(request: Request) -> Response:
        target = request.path_params["request_id"]
        pipe = state.pipeline
        if pipe is None or target not in state.active:
            return error_response(404, f"no request {target!r} is in flight", "invalid_request_error", "not_found")
        await pipe.abort(target)
        return JSONResponse({"id": target, "status": "aborting"})

    async def models(request: Request) -> Response:
        models: list[dict[str, object]] = []
        for name in (state.model_name, *state.aliases):
            model: dict[str, object] = {"id": name, "object": "model", "created": state.created, "owned_by": "omnictl"}
            if state.pipeline is not None:  # which endpoints this model answers (an omnictl extra)
                model["endpoints"] = capabilities(state.pipeline.topology).endpoints()
            models.append(model)
        return JSONResponse({"object": "list", "data": models})

    async def health(request: Request) -> Response:
        pipe = state.pipeline
        if pipe is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        stages = await pipe.stats(HEALTH_STATS_TIMEOUT_S)
        status, replicas_down = pipe.health()
        # Liveness: a process that is up but does not answer (frozen by SIGSTOP, its IO loop
        # stuck) is not serving; requests pinned to it hang. Once 200, now 503 naming it.
        unresponsive = unresponsive_processes(stages)
        note_unresponsive(state, pipe, unresponsive)
        note_busy(state, stages)
        if unresponsive and status != "down":
            status = "unresponsive"
        code = 503 if status in ("down", "unresponsive") else 200
        if not key_presented(request, state.api_key):
            # A load balancer probes without the key: it gets the verdict and nothing
            # more. PIDs, the run directory's path and the stages' state are the key's.
            return JSONResponse({"status": status}, status_code=code)
        body = {
            # ok; degraded (200): some replica is down, every process still has one up;
            # down (503): some process has no replica up
            "status": status,
            "down": sorted(name for name, info in stages.items() if info.get("status") == "down"),
            "replicas_down": replicas_down,  # OS process (``tts#1``) -> why
            "unresponsive": unresponsive,  # OS processes up but not answering within the timeout
            "busy": busy_stages(stages),  # stage -> seconds in its current compute step, when >= BUSY_STEP_S
            "processes": pipe.process_ids(),  # OS process -> pid
            "in_flight": len(state.active),  # requests this server is answering
            "pipeline_in_flight": pipe.in_flight(),  # requests the coordinator still tracks
            "stages": stages,  # per stage: status and the state it holds (queued, running, buffers)
            "realtime": calls.stats(),  # realtime sessions open, by transport, and WebRTC peer connections
            "nodes": pipe.nodes(),  # per node label ("-": the coordinator's machine): status, processes
            # where the profiler writes traces: `omnictl trace` and a local bench read it
            "run_dir": str(pipe.run_dir) if pipe.run_dir is not None else None,
        }
        return JSONResponse(body, status_code=code)

    async def metrics(request: Request) -> Response:
        # Behind the key like every route but /health's verdict: it tells traffic, models and failures
        # (Prometheus scrapes with `authorization: {credentials: KEY}`).
        pipe = state.pipeline
        if pipe is not None:
            state.metrics.queue_depth.set(pipe.admission.queued)
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    def keyed(endpoint: HttpEndpoint, counted: bool = False) -> HttpEndpoint:
        return requires_key(state, endpoint, counted=counted)

    # Every route that takes input goes through the key (auth.OPEN_ROUTES are the open ones;
    # tests/serving/common/test_route_auth.py walks this table). ``counted``: a 401 there is a request
    # outcome in the metrics (``rejected``), as it was for the inference routes.
    routes: list[BaseRoute] = [
        Route("/", playground.page, methods=["GET"]),
        Route("/v1/chat/completions", keyed(chat.endpoint(state), counted=True), methods=["POST"]),
        Route("/v1/audio/speech", keyed(speech.endpoint(state), counted=True), methods=["POST"]),
        Route("/v1/audio/transcriptions", keyed(transcriptions.endpoint(state), counted=True), methods=["POST"]),
        Route(
            "/v1/audio/translations", keyed(transcriptions.endpoint(state, "translate"), counted=True), methods=["POST"]
        ),
        Route("/v1/audio/voices", keyed(voices.endpoint(state)), methods=["GET"]),
        WebSocketRoute("/v1/realtime", requires_key_socket(state, realtime_endpoint(realtime))),
        Route("/v1/realtime/calls", keyed(calls.create, counted=True), methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/hangup", keyed(calls.hangup), methods=["POST"]),
        Route("/v1/requests/{request_id}/abort", keyed(abort_request), methods=["POST"]),
        Route("/v1/models", keyed(models), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", keyed(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(GuardMiddleware, guard=guard or RequestGuard())  # outermost: before anything reads the request
    return app
