"""``/v1/realtime``: the WebSocket transport. Auth, the socket's writer and receive loop.

The API key comes as ``Authorization: Bearer`` (the ``openai`` client) or, from a
browser (which cannot set headers on a WebSocket), as the subprotocol
``openai-insecure-api-key.<key>`` as OpenAI's own browser clients send it. A wrong or
missing key closes the handshake (HTTP 403). ``?model=`` is checked like the HTTP
endpoints' ``model`` (the topology's name or a ``--served-model-name``), ``?intent=``
(``realtime``, ``transcription``) sets the session's type; a wrong one is answered with an
``error`` event naming it, and the socket is closed (1008). A topology that only transcribes
(a ``transcript`` terminal, no text or audio one: Qwen3-ASR) opens transcription sessions,
without ``?intent=`` too, and refuses ``?intent=realtime`` naming why. Every message is bounded
(``Limits.max_realtime_message_bytes``): a bigger one is answered with an ``error``
event naming the limit, and the session goes on (:class:`~omnictl.serving.realtime.channel.RealtimeHub`,
shared with the WebRTC transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnictl.serving.common.auth import KEY_PROTOCOL
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.echo import clip
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.channel import Outbox, RealtimeHub, Slot
from omnictl.serving.realtime.duplex import serve_duplex
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.state import PipelineLike

log = logging.getLogger("omnictl.serving.realtime")
CLOSE_POLICY = 1008
__all__ = ["KEY_PROTOCOL", "realtime_endpoint"]  # KEY_PROTOCOL: checked in common/auth, the browser's key
CLOSE_TRY_LATER = 1013
CLOSE_NOT_READING = 1008  # policy violation: the client let its events pile up unread


def _offered_protocols(websocket: WebSocket) -> list[str]:
    header = websocket.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def realtime_endpoint(hub: RealtimeHub) -> Callable[[WebSocket], Awaitable[None]]:
    state = hub.state

    async def realtime(websocket: WebSocket) -> None:
        # the key was checked before this (auth.requires_key_socket, in the route table)
        pipe = state.pipeline
        if pipe is None:
            await websocket.close(code=CLOSE_TRY_LATER, reason="the pipeline is still starting; retry shortly")
            return
        serves = capabilities(pipe.topology)
        if not serves.realtime:
            await websocket.close(
                code=CLOSE_POLICY, reason=f"topology {pipe.topology.name!r} has no text, audio or transcript terminal"
            )
            return
        # The slot is claimed before the first await (the handshake's accept): sessions that
        # arrive together must not all pass one check and then open past the limit.
        slot = hub.claim("websocket")
        try:
            if serves.full_duplex:  # no turns: one session-long request (omnictl/serving/realtime/duplex.py)
                await serve_duplex(websocket, slot, hub, pipe)
            else:
                await _serve(websocket, slot, hub, pipe)
        finally:
            if isinstance(slot, Slot):
                slot.release()  # however it ended: refused, closed, failed, cancelled

    return realtime


async def _serve(websocket: WebSocket, slot: Slot | ev.EventError, hub: RealtimeHub, pipe: PipelineLike) -> None:
    state = hub.state
    # a browser that sent its key as a subprotocol needs one echoed back
    offered = [p for p in _offered_protocols(websocket) if p == "realtime"] or None
    await websocket.accept(subprotocol=offered[0] if offered else None)
    if isinstance(slot, ev.EventError):
        # Refused in the protocol's own words, then closed: "try again later".
        state.metrics.outcome("rejected")
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(ev.encode(ev.error_event(slot)))
            await websocket.close(code=CLOSE_TRY_LATER, reason="too many realtime sessions")
        return
    refused = hub.refused(websocket.query_params, pipe)
    if refused is not None:
        state.metrics.outcome("rejected")
        log.warning("realtime: connection refused: %s", clip(refused.message))
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(ev.encode(ev.error_event(refused)))
            await websocket.close(code=CLOSE_POLICY, reason=clip(refused.message, 100))
        return
    outbox = Outbox(state.limits.max_realtime_outbox_bytes)
    session = hub.session(pipe, outbox.put, websocket.query_params, websocket.headers, "websocket")
    writer = asyncio.create_task(_write(websocket, outbox))
    receiver = asyncio.create_task(_receive(websocket, session, hub))
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
        slot.release()
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


def _hang_up(websocket: WebSocket, code: int, reason: str) -> None:
    """Close now, without waiting for a client that does not read (see omnictl.serving.common.connections)."""
    hang_up = websocket.scope.get("extensions", {}).get("omnictl.hangup")
    if hang_up is not None:
        hang_up(code, reason)


async def _write(websocket: WebSocket, outbox: Outbox) -> None:
    while (message := await outbox.get()) is not None:
        await websocket.send_text(message)


async def _receive(websocket: WebSocket, session: RealtimeSession, hub: RealtimeHub) -> None:
    while True:
        try:
            message = await websocket.receive()
        except WebSocketDisconnect:
            return
        if message["type"] == "websocket.disconnect":
            return
        text: str | None = message.get("text")
        await hub.deliver(session, text if text is not None else message.get("bytes") or b"")
