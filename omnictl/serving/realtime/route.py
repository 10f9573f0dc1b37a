"""``/v1/realtime``: the WebSocket endpoint. Auth, the session's writer and receive loop, limits.

The API key comes as ``Authorization: Bearer`` (the ``openai`` client) or, from a
browser (which cannot set headers on a WebSocket), as the subprotocol
``openai-insecure-api-key.<key>`` as OpenAI's own browser clients send it. A wrong or
missing key closes the handshake (HTTP 403). Every message is bounded
(``Limits.max_realtime_message_bytes``): a bigger one is answered with an ``error``
event naming the limit, and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnictl.serving.auth import authorized
from omnictl.serving.capabilities import capabilities
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.realtime.vad import SileroModel
from omnictl.serving.state import ServingState

log = logging.getLogger("omnictl.serving.realtime")
KEY_PROTOCOL = "openai-insecure-api-key."
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013


def _offered_protocols(websocket: WebSocket) -> list[str]:
    header = websocket.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def _allowed(websocket: WebSocket, api_key: str | None) -> bool:
    if authorized(websocket.headers, api_key):
        return True
    assert api_key is not None
    return any(p.startswith(KEY_PROTOCOL) and hmac.compare_digest(p[len(KEY_PROTOCOL):].encode(), api_key.encode())
               for p in _offered_protocols(websocket))


class _Silero:
    """The VAD model, loaded once per server when the first session needs it."""

    def __init__(self) -> None:
        self.model: SileroModel | None = None

    def __call__(self) -> SileroModel:
        if self.model is None:
            self.model = SileroModel()
        return self.model


def realtime_endpoint(state: ServingState) -> Callable[[WebSocket], Awaitable[None]]:
    silero = _Silero()

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
            await websocket.close(code=CLOSE_POLICY, reason=f"topology {pipe.topology.name!r} has no text or audio terminal")
            return
        # a browser that sent its key as a subprotocol needs one echoed back
        offered = [p for p in _offered_protocols(websocket) if p == "realtime"] or None
        await websocket.accept(subprotocol=offered[0] if offered else None)
        outbox: asyncio.Queue[str | None] = asyncio.Queue()
        model = websocket.query_params.get("model") or state.model_name
        session = RealtimeSession(state, pipe, lambda event: outbox.put_nowait(ev.encode(event)), model, silero,
                                  traceparent=state.traceparent(websocket.headers))
        writer = asyncio.create_task(_write(websocket, outbox))
        session.send(ev.SessionCreated(session=session.session_object()))
        try:
            await _receive(websocket, session, state.limits.max_realtime_message_bytes)
        finally:
            await session.close()
            outbox.put_nowait(None)
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):  # the socket is gone: nothing left to tell
                await writer

    return realtime


async def _write(websocket: WebSocket, outbox: asyncio.Queue[str | None]) -> None:
    while (message := await outbox.get()) is not None:
        await websocket.send_text(message)


async def _receive(websocket: WebSocket, session: RealtimeSession, limit: int) -> None:
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
            if len(raw) > limit:
                raise ev.EventError(f"the message is {len(raw)} bytes; this server takes events up to {limit} bytes "
                                    "(send audio in smaller appends)", "message_too_large")
            await session.handle(ev.decode_client_event(raw))
        except ev.EventError as error:
            log.info("realtime session %s: %s (event %s)", session.id, error.message, error.event_id)
            session.send(ev.error_event(error))
