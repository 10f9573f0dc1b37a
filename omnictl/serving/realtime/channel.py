"""What every realtime transport shares, so that none holds its own copy of it.

A transport (the WebSocket of :mod:`~omnictl.serving.realtime.route`, the WebRTC call of
:mod:`~omnictl.serving.realtime.webrtc`) only moves bytes: it opens a
:class:`~omnictl.serving.realtime.session.RealtimeSession` through :class:`RealtimeHub`
(which checks ``?model=`` / ``?intent=`` and the session count the same way for both),
hands each client message to :meth:`RealtimeHub.deliver` (size limit, parsing, the
``error`` event and its log line), and writes what the session's :class:`Outbox` holds.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping

from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.echo import RepeatLimiter, clip, clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.responses import AudioOut
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.realtime.vad import SileroModel
from omnictl.serving.state import PipelineLike, ServingState

log = logging.getLogger("omnictl.serving.realtime")
INTENTS = ("realtime", "transcription")


class Outbox:
    """Server events waiting for the transport, bounded (``Limits.max_realtime_outbox_bytes``).

    A client that sends and never reads once grew the server by 1.5 GB in 2 s: every event
    queued while the writer waited on the socket. Past the bound, nothing more is queued,
    ``overflowed`` is set, and the transport hangs up. One event always fits into an empty
    outbox, whatever its size."""

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


class _Silero:
    """The VAD model, loaded once per server when the first session needs it."""

    def __init__(self) -> None:
        self.model: SileroModel | None = None

    def __call__(self) -> SileroModel:
        if self.model is None:
            self.model = SileroModel()
        return self.model


def message_size(raw: str | bytes) -> int:
    """Bytes on the wire: a text message's limit counts UTF-8 bytes, not characters."""
    if isinstance(raw, bytes) or raw.isascii():
        return len(raw)
    return len(raw.encode("utf-8", "surrogatepass"))


@dataclass(eq=False)
class Slot:
    """One realtime session's place under ``--max-realtime-sessions``, claimed at the door
    (:meth:`RealtimeHub.claim`, before the transport's first await) and given back once by
    :meth:`release`, however the session ends. A WebRTC call's slot is ``connecting`` too
    until its peer connection connects (``--max-connecting-calls``)."""

    hub: RealtimeHub
    transport: str
    connecting: bool = False
    released: bool = False
    claimed_at: float = field(default_factory=time.monotonic)
    call: str | None = None  # the WebRTC call holding it, once there is one (which then releases it)

    def connected(self) -> None:
        """The call connected: it no longer counts against the connecting calls' cap."""
        if self.connecting and not self.released:
            self.connecting = False
            self.hub.connecting -= 1

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.hub.open -= 1
        self.hub.by_transport[self.transport] -= 1
        if self.connecting:
            self.connecting = False
            self.hub.connecting -= 1


class RealtimeHub:
    """The server's realtime sessions, over any transport: one count, one VAD model, one set of checks."""

    def __init__(self, state: ServingState) -> None:
        self.state = state
        self.silero = _Silero()
        self.limiter = RepeatLimiter()
        self.open = 0  # sessions open, WebSocket and WebRTC together (``--max-realtime-sessions``)
        self.connecting = 0  # WebRTC calls among them not yet connected (``--max-connecting-calls``)
        self.by_transport: collections.Counter[str] = collections.Counter()

    def refused(self, query: Mapping[str, str], pipe: PipelineLike) -> ev.EventError | None:
        """Why a session with this ``?model=`` / ``?intent=`` cannot be served, if it cannot."""
        model = query.get("model")
        served = (self.state.model_name, *self.state.aliases)
        if model and model not in served:
            return ev.EventError(
                f"the model {clip_repr(model, 64)} does not exist; this server serves "
                f"{', '.join(repr(m) for m in served)}",
                "model_not_found",
                "model",
            )
        intent = query.get("intent")
        if intent is not None and intent not in INTENTS:
            return ev.EventError(
                f"intent {clip_repr(intent, 64)} is not one of {', '.join(INTENTS)}", "invalid_value", "intent"
            )
        if intent == "realtime" and not capabilities(pipe.topology).conversation:
            return ev.EventError(
                f"intent 'realtime': topology {pipe.topology.name!r} only transcribes (a 'transcript' terminal, no "
                "text or audio one): nothing answers a conversation; open a session with ?intent=transcription",
                "unsupported_session_type",
                "intent",
            )
        if intent == "transcription" and not capabilities(pipe.topology).transcription:
            return ev.EventError(
                f"intent 'transcription': topology {pipe.topology.name!r} has no terminal of modality 'transcript'",
                "unsupported_session_type",
                "intent",
            )
        return None

    def claim(self, transport: str) -> Slot | ev.EventError:
        """A slot for a new session, counted from now on; or the protocol's refusal when no more
        sessions may open ("try again later"). Claimed before anything is awaited, so that
        sessions arriving together cannot all pass one check and open past the limit; a WebRTC
        call's slot is also one of the few that may be connecting at once."""
        limit = self.state.limits.max_realtime_sessions
        if self.open >= limit:
            return ev.EventError(
                f"this server runs at most {limit} realtime sessions at once (--max-realtime-sessions), "
                "WebSocket and WebRTC together; retry later",
                "session_limit_reached",
                kind="rate_limit_error",
            )
        connecting = transport == "webrtc"
        if connecting and self.connecting >= self.state.limits.max_realtime_connecting:
            return ev.EventError(
                f"this server lets at most {self.state.limits.max_realtime_connecting} WebRTC calls be "
                "connecting at once (answered, not yet connected; --max-connecting-calls); retry later",
                "connecting_limit_reached",
                kind="rate_limit_error",
            )
        self.open += 1
        self.by_transport[transport] += 1
        if connecting:
            self.connecting += 1
        return Slot(self, transport, connecting)

    def session(
        self,
        pipe: PipelineLike,
        send: Callable[[ev.ServerEvent], None],
        query: Mapping[str, str],
        headers: Mapping[str, str],
        transport: str,
        audio_out: AudioOut | None = None,
    ) -> RealtimeSession:
        """A new session (its slot is the transport's, claimed by :meth:`claim` and released by it)."""
        return RealtimeSession(
            self.state,
            pipe,
            send,
            query.get("model") or self.state.model_name,
            self.silero,
            traceparent=self.state.traceparent(headers),
            intent=query.get("intent"),
            transport=transport,
            audio_out=audio_out,
        )

    async def deliver(self, session: RealtimeSession, raw: str | bytes) -> None:
        """One client message: bounded, parsed, handled; anything wrong is answered with an ``error`` event."""
        limit = self.state.limits.max_realtime_message_bytes

        async def handle() -> None:
            size = message_size(raw)
            if size > limit:
                await self.too_large(size)
            await session.handle(ev.decode_client_event(raw))

        await self.guarded(session, handle, "event")

    async def too_large(self, size: int) -> None:
        """Refuse a client message of ``size`` bytes, past ``Limits.max_realtime_message_bytes``."""
        limit = self.state.limits.max_realtime_message_bytes
        raise ev.EventError(
            f"the message is {size} bytes; this server takes events up to {limit} bytes (send audio in smaller appends)",
            "message_too_large",
        )

    async def guarded(self, session: RealtimeSession, work: Callable[[], Awaitable[None]], what: str) -> None:
        """Run ``work`` for ``session``: an :class:`~ev.EventError` becomes the ``error`` event (logged
        once per interval per kind), anything else a ``server_error`` (logged with its traceback)."""
        try:
            await work()
        except ev.EventError as error:
            allowed, suppressed = self.limiter.allow(f"{session.id}:{error.code}")
            if allowed:  # a client repeating one mistake logs it once per interval, clipped
                more = f" ({suppressed} more like it not logged)" if suppressed else ""
                log.warning(
                    "realtime session %s (%s): refused: %s (%s %s)%s",
                    session.id,
                    session.transport,
                    clip(error.message),
                    what,
                    clip(error.event_id or "-", 64),
                    more,
                )
            session.send(ev.error_event(error))
        except Exception as exc:
            log.exception(
                "realtime session %s (%s): handling a %s failed (%s)",
                session.id,
                session.transport,
                what,
                clip(type(exc).__name__),
            )
            session.send(
                ev.error_event(
                    ev.EventError(
                        f"the server could not handle this {what} ({type(exc).__name__})",
                        "server_error",
                        kind="server_error",
                    )
                )
            )
