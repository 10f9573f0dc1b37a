"""``/v1/realtime``: the WebSocket endpoint. Auth, the session's writer and receive loop, limits.

The API key comes as ``Authorization: Bearer`` (the ``openai`` client) or, from a
browser (which cannot set headers on a WebSocket), as the subprotocol
``openai-insecure-api-key.<key>`` as OpenAI's own browser clients send it. A wrong or
missing key closes the handshake (HTTP 403). ``?model=`` is checked like the HTTP
endpoints' ``model`` (the topology's name or a ``--served-model-name``), ``?intent=``
(``realtime``, ``transcription``) sets the session's type; a wrong one is answered with an
``error`` event naming it, and the socket is closed (1008). Every message is bounded
(``Limits.max_realtime_message_bytes``): a bigger one is answered with an ``error``
event naming the limit, and the session goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
from typing import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnictl.serving.common.auth import authorized
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.echo import RepeatLimiter, clip, clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.realtime.vad import SileroModel
from omnictl.serving.state import PipelineLike, ServingState

log = logging.getLogger("omnictl.serving.realtime")
KEY_PROTOCOL = "openai-insecure-api-key."
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013
CLOSE_NOT_READING = 1008  # policy violation: the client let its events pile up unread


def _offered_protocols(websocket: WebSocket) -> list[str]:
    header = websocket.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def _allowed(websocket: WebSocket, api_key: str | None) -> bool:
    if authorized(websocket.headers, api_key):
        return True
    assert api_key is not None
    return any(
        p.startswith(KEY_PROTOCOL) and hmac.compare_digest(p[len(KEY_PROTOCOL) :].encode(), api_key.encode())
        for p in _offered_protocols(websocket)
    )


class _Silero:
    """The VAD model, loaded once per server when the first session needs it."""

    def __init__(self) -> None:
        self.model: SileroModel | None = None

    def __call__(self) -> SileroModel:
        if self.model is None:
            self.model = SileroModel()
        return self.model


class Outbox:
    """Server events waiting for the socket, bounded (``Limits.max_realtime_outbox_bytes``).

    A client that sends and never reads once grew the server by 1.5 GB in 2 s: every event
    queued while the writer waited on the socket. Past the bound, nothing more is queued,
    ``overflowed`` is set, and the route hangs up with ``CLOSE_NOT_READING``. One event
    always fits into an empty outbox, whatever its size."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0  # characters queued (events are JSON text, nearly all ASCII)
        self.overflowed = asyncio.Event()
        self._queue: collections.deque[str] = collections.deque()
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, event: ev.ServerEvent) -> None:
        if self._closed or self.overflowed.is_set():
            return
        text = ev.encode(event)
        if self._queue and self.pending + len(text) > self.limit:
            self.overflowed.set()
            return
        self._queue.append(text)
        self.pending += len(text)
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> str | None:
        """The next event's text; None once closed and drained."""
        while not self._queue:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        text = self._queue.popleft()
        self.pending -= len(text)
        return text


def realtime_endpoint(state: ServingState) -> Callable[[WebSocket], Awaitable[None]]:
    silero = _Silero()
    sessions = _Sessions()
    limiter = RepeatLimiter()

    async def realtime(websocket: WebSocket) -> None:
        if not _allowed(websocket, state.api_key):
            state.metrics.outcome("rejected")
            await websocket.close(code=CLOSE_POLICY, reason="missing or wrong API key")
            return
        pipe = state.pipeline
        if pipe is None:
            await websocket.close(code=CLOSE_TRY_LATER, reason="the pipeline is still starting; retry shortly")
            return
        if not capabilities(pipe.topology).realtime:
            await websocket.close(
                code=CLOSE_POLICY, reason=f"topology {pipe.topology.name!r} has no text or audio terminal"
            )
            return
        # a browser that sent its key as a subprotocol needs one echoed back
        offered = [p for p in _offered_protocols(websocket) if p == "realtime"] or None
        await websocket.accept(subprotocol=offered[0] if offered else None)
        limits = state.limits
        if sessions.open >= limits.max_realtime_sessions:
            # Refused in the protocol's own words, then closed: "try again later".
            state.metrics.outcome("rejected")
            error = ev.EventError(
                f"this server runs at most {limits.max_realtime_sessions} realtime sessions at once "
                "(--max-realtime-sessions); retry later",
                "session_limit_reached",
                kind="rate_limit_error",
            )
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await websocket.send_text(ev.encode(ev.error_event(error)))
                await websocket.close(code=CLOSE_TRY_LATER, reason="too many realtime sessions")
            return
        refused = _refused_query(websocket, state, pipe)
        if refused is not None:
            state.metrics.outcome("rejected")
            log.warning("realtime: connection refused: %s", clip(refused.message))
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await websocket.send_text(ev.encode(ev.error_event(refused)))
                await websocket.close(code=CLOSE_POLICY, reason=clip(refused.message, 100))
            return
        sessions.open += 1
        outbox = Outbox(limits.max_realtime_outbox_bytes)
        model = websocket.query_params.get("model") or state.model_name
        session = RealtimeSession(
            state,
            pipe,
            outbox.put,
            model,
            silero,
            traceparent=state.traceparent(websocket.headers),
            intent=websocket.query_params.get("intent"),
        )
        writer = asyncio.create_task(_write(websocket, outbox))
        receiver = asyncio.create_task(_receive(websocket, session, limits.max_realtime_message_bytes, limiter))
        overflow = asyncio.create_task(outbox.overflowed.wait())
        session.send(ev.SessionCreated(session=session.session_object()))
        try:
            await asyncio.wait({receiver, overflow, writer}, return_when=asyncio.FIRST_COMPLETED)
            if outbox.overflowed.is_set():
                log.warning(
                    "realtime session %s: the client is not reading its events (%d characters waiting, the "
                    "limit is %d): closing it with code %d",
                    session.id,
                    outbox.pending,
                    outbox.limit,
                    CLOSE_NOT_READING,
                )
                _hang_up(websocket, CLOSE_NOT_READING, "the client is not reading its events")
        finally:
            sessions.open -= 1
            overflow.cancel()
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError):
                await receiver
            await session.close()
            if outbox.overflowed.is_set():
                writer.cancel()
            outbox.close()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError):
                await writer  # the socket is gone: nothing left to tell

    return realtime


class _Sessions:
    open = 0


INTENTS = ("realtime", "transcription")


def _refused_query(websocket: WebSocket, state: ServingState, pipe: PipelineLike) -> ev.EventError | None:
    """Why the handshake's ``?model=`` / ``?intent=`` cannot be served, if they cannot."""
    model = websocket.query_params.get("model")
    served = (state.model_name, *state.aliases)
    if model and model not in served:
        return ev.EventError(
            f"the model {clip_repr(model, 64)} does not exist; this server serves {', '.join(repr(m) for m in served)}",
            "model_not_found",
            "model",
        )
    intent = websocket.query_params.get("intent")
    if intent is not None and intent not in INTENTS:
        return ev.EventError(
            f"intent {clip_repr(intent, 64)} is not one of {', '.join(INTENTS)}", "invalid_value", "intent"
        )
    if intent == "transcription" and not capabilities(pipe.topology).transcription:
        return ev.EventError(
            f"intent 'transcription': topology {pipe.topology.name!r} has no terminal of modality 'transcript'",
            "unsupported_session_type",
            "intent",
        )
    return None


def _hang_up(websocket: WebSocket, code: int, reason: str) -> None:
    """Close now, without waiting for a client that does not read (see omnictl.serving.common.connections)."""
    hang_up = websocket.scope.get("extensions", {}).get("omnictl.hangup")
    if hang_up is not None:
        hang_up(code, reason)


async def _write(websocket: WebSocket, outbox: Outbox) -> None:
    while (message := await outbox.get()) is not None:
        await websocket.send_text(message)


def _size(raw: str | bytes) -> int:
    """Bytes on the wire: a text frame's limit counts UTF-8 bytes, not characters."""
    if isinstance(raw, bytes) or raw.isascii():
        return len(raw)
    return len(raw.encode("utf-8", "surrogatepass"))


async def _receive(websocket: WebSocket, session: RealtimeSession, limit: int, limiter: RepeatLimiter) -> None:
    while True:
        try:
            message = await websocket.receive()
        except WebSocketDisconnect:
            return
        if message["type"] == "websocket.disconnect":
            return
        text: str | None = message.get("text")
        raw: str | bytes = text if text is not None else message.get("bytes") or b""
        try:
            size = _size(raw)
            if size > limit:
                raise ev.EventError(
                    f"the message is {size} bytes; this server takes events up to {limit} bytes "
                    "(send audio in smaller appends)",
                    "message_too_large",
                )
            await session.handle(ev.decode_client_event(raw))
        except ev.EventError as error:
            allowed, suppressed = limiter.allow(f"{session.id}:{error.code}")
            if allowed:  # a client repeating one mistake logs it once per interval, clipped
                more = f" ({suppressed} more like it not logged)" if suppressed else ""
                log.warning(
                    "realtime session %s: refused: %s (event %s)%s",
                    session.id,
                    clip(error.message),
                    clip(error.event_id or "-", 64),
                    more,
                )
            session.send(ev.error_event(error))
        except Exception as exc:
            log.exception("realtime session %s: handling a %s event failed", session.id, clip(type(exc).__name__))
            session.send(
                ev.error_event(
                    ev.EventError(
                        f"the server could not handle this event ({type(exc).__name__})",
                        "server_error",
                        kind="server_error",
                    )
                )
            )
