"""Connection limits below the ASGI app: header and idle timeouts, a cap on open connections.

uvicorn bounds request bodies (we do, ``--body-timeout``) and idle keep-alive gaps, but
not a connection that sends nothing, or part of its headers: 1,100 of them under a
1,024 open-files limit once made every route hang and asyncio log ``socket.accept() out
of system resource`` in a tight loop. Here, as uvicorn protocol classes:

- a connection must complete its request headers within ``header_timeout_s`` of opening
  (and of its previous response), or it is closed;
- at most ``max_connections`` are open (HTTP and WebSocket together), below the
  open-files limit (:func:`connection_cap`). At the cap a new connection closes the
  oldest *idle* one (no request in progress: opened or kept alive, headers unfinished),
  so a client that holds idle sockets cannot keep out a new client; with none idle the
  new one is closed at once;
- a WebSocket session can be hung up from the app (``scope["extensions"]["omnictl.hangup"]``):
  the close frame is queued behind whatever the client has not read (without waiting for
  it to drain), and the TCP connection is cut if the client has not answered it
  ``HANGUP_GRACE_S`` later (a client that never reads would otherwise hold it, and its
  buffers, forever);
- accept errors (out of file descriptors) are logged once a minute, without a traceback.

uvicorn has no public hook for any of the first three (``limit_concurrency`` answers 503
after the headers and evicts nothing; nothing times out headers; ``websocket.close`` waits
behind what the client has not read), but ``uvicorn.Config`` takes the protocol classes to
use, and these subclass its own h11 and websockets-sansio ones: private classes, which a
uvicorn release may change. So pyproject.toml pins uvicorn to the versions they were checked
on, :data:`UVICORN_PRIVATE_API` lists what of them is used, and
``tests/serving/common/test_uvicorn_private_api.py`` fails naming what moved (then check the
subclasses against the new uvicorn and widen the range).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import re
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger("omnictl.serving")

# What the guard uses of uvicorn's private protocol classes: the methods it overrides or
# calls (with their parameters) and the attributes it reads or sets (``self.<name>`` in the
# class's source). Checked by tests/serving/common/test_uvicorn_private_api.py.
UVICORN_PRIVATE_API: dict[type, tuple[dict[str, tuple[str, ...]], tuple[str, ...]]] = {
    H11Protocol: (
        {
            "connection_made": ("self", "transport"),
            "data_received": ("self", "data"),
            "on_response_complete": ("self",),
            "handle_websocket_upgrade": ("self", "event"),
            "connection_lost": ("self", "exc"),
        },
        ("cycle", "transport", "loop"),
    ),
    RequestResponseCycle: ({}, ("response_complete",)),
    WebSocketsSansIOProtocol: (
        {
            "connection_made": ("self", "transport"),
            "handle_connect": ("self", "event"),
            "connection_lost": ("self", "exc"),
        },
        ("scope", "transport", "loop", "conn", "close_sent", "queue", "read_paused", "close_timer"),
    ),
}


def uvicorn_api_missing() -> list[str]:
    """What of :data:`UVICORN_PRIVATE_API` this uvicorn lacks, one line each (empty: all there)."""
    missing = []
    for cls, (methods, attributes) in UVICORN_PRIVATE_API.items():
        where = f"{cls.__module__}.{cls.__qualname__}"
        for name, parameters in methods.items():
            method = getattr(cls, name, None)
            if not callable(method):
                missing.append(f"{where}.{name}: no such method")
                continue
            found = tuple(inspect.signature(method).parameters)
            if found != parameters:
                missing.append(f"{where}.{name}: takes ({', '.join(found)}), not ({', '.join(parameters)})")
        source = inspect.getsource(cls)
        missing += [f"{where}: no self.{name}" for name in attributes if not re.search(rf"\bself\.{name}\b", source)]
    return missing


RESERVED_FDS = 256  # what the server needs beside client sockets: stage sockets, shared memory, logs, models
HANGUP_GRACE_S = 10.0
_LOG_EVERY_S = 60.0


def connection_cap(requested: int | None) -> int:
    """``requested`` (None: as many as fit), never within ``RESERVED_FDS`` of the open-files limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fits = max(16, soft - RESERVED_FDS) if soft != resource.RLIM_INFINITY else 65_536
    return fits if requested is None else max(1, min(requested, fits))


@dataclass
class ConnectionGuard:
    """Shared by every connection of one server: the cap, the idle connections, the counts."""

    max_connections: int
    header_timeout_s: float
    open: int = 0
    refused: int = 0  # closed at once: at the cap with none idle
    evicted: int = 0  # idle connections closed to make room
    timed_out: int = 0  # closed for not finishing their headers in time
    idle: collections.OrderedDict[Any, None] = field(default_factory=collections.OrderedDict)
    _said: dict[str, float] = field(default_factory=dict)

    def say(self, key: str, message: str, *args: Any) -> None:
        """Log ``message`` at WARNING at most once a minute per ``key``."""
        now = time.monotonic()
        if now - self._said.get(key, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._said[key] = now
            log.warning(message, *args)

    def make_room(self) -> bool:
        """Whether a new connection may stay: under the cap, or an idle one was closed for it."""
        if self.open < self.max_connections:
            return True
        while self.idle:
            oldest, _ = self.idle.popitem(last=False)
            if oldest.close_idle():
                self.evicted += 1
                self.say(
                    "evicted",
                    "at the limit of %d open connections: closing idle ones to let new clients in "
                    "(--max-connections; logged once a minute)",
                    self.max_connections,
                )
                return True
        return False

    def accept_errors(self, loop: asyncio.AbstractEventLoop) -> Any:
        """Log asyncio's accept failures (EMFILE...) once a minute instead of a traceback each
        time; returns the handler it replaced (for ``loop.set_exception_handler`` when done)."""
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message", "").startswith("socket.accept() out of system resource"):
                self.say(
                    "accept",
                    "cannot accept connections: %s (open: %d; lower --max-connections or raise the "
                    "open-files limit; logged once a minute)",
                    context.get("exception"),
                    self.open,
                )
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        return previous

    def http_protocol(self) -> type[H11Protocol]:
        guard = self

        class GuardedH11Protocol(H11Protocol):
            _armed: Any = None
            _timer: asyncio.TimerHandle | None = None
            _counted = False

            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn types the transport as BaseTransport; it is always an asyncio.Transport here
                super().connection_made(transport)
                if not guard.make_room():
                    guard.refused += 1
                    guard.say(
                        "refused",
                        "at the limit of %d open connections with none idle: refusing new ones "
                        "(--max-connections; logged once a minute)",
                        guard.max_connections,
                    )
                    transport.close()
                    return
                guard.open += 1
                self._counted = True
                self._wait_for_headers()

            def _wait_for_headers(self) -> None:
                self._armed = self.cycle
                guard.idle[self] = None
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self.loop.call_later(guard.header_timeout_s, self._headers_late)

            def _headers_late(self) -> None:
                self._timer = None
                if self.cycle is self._armed and self.close_idle():
                    guard.timed_out += 1

            def close_idle(self) -> bool:
                """Close this connection if it still has no request in progress (and is still HTTP)."""
                guard.idle.pop(self, None)
                if self.transport.is_closing() or self.transport.get_protocol() is not self:
                    return False
                if self.cycle is not None and not self.cycle.response_complete:
                    return False
                self.transport.close()
                return True

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                if self.cycle is not self._armed:  # headers complete: a request is in progress
                    guard.idle.pop(self, None)
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
                    self._armed = self.cycle

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if (
                    not self.transport.is_closing()
                    and self.transport.get_protocol() is self
                    and (self.cycle is None or self.cycle.response_complete)
                ):
                    self._wait_for_headers()

            def handle_websocket_upgrade(self, event: Any) -> None:
                guard.idle.pop(self, None)
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self._counted:  # the WebSocket protocol counts the connection from here on
                    self._counted = False
                    guard.open -= 1
                super().handle_websocket_upgrade(event)

            def connection_lost(self, exc: Exception | None) -> None:
                guard.idle.pop(self, None)
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self._counted:
                    self._counted = False
                    guard.open -= 1
                super().connection_lost(exc)

        return GuardedH11Protocol

    def websocket_protocol(self) -> type[WebSocketsSansIOProtocol]:
        guard = self

        class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
            _counted = False
            _hung_up = False

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                guard.open += 1
                self._counted = True

            def handle_connect(self, event: Any) -> None:
                super().handle_connect(event)
                scope = getattr(self, "scope", None)
                if scope is not None:
                    scope.setdefault("extensions", {})["omnictl.hangup"] = self.hang_up

            def hang_up(self, code: int, reason: str) -> None:
                """Queue a close frame without waiting for the socket to drain; cut the
                connection if the client has not answered it within HANGUP_GRACE_S.

                Until then the connection keeps reading, and drops, whatever the client
                sends (as uvicorn does after its own close): closing a socket with unread
                input would reset it, and the close frame would never arrive."""
                if self.transport.is_closing() or self._hung_up:
                    return  # the first hang-up's close frame and grace stand
                self._hung_up = True
                if not self.close_sent:
                    self.close_sent = True
                    self.conn.send_close(code, reason)
                    self.transport.write(b"".join(self.conn.data_to_send()))
                self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
                if self.read_paused:
                    self.read_paused = False
                    self.transport.resume_reading()
                if self.close_timer is not None:
                    self.close_timer.cancel()
                # the client's close reply closes the connection (uvicorn's handle_close); this, if none comes
                self.close_timer = self.loop.call_later(HANGUP_GRACE_S, self.transport.abort)

            def connection_lost(self, exc: Exception | None) -> None:
                if self._counted:
                    self._counted = False
                    guard.open -= 1
                super().connection_lost(exc)

        return GuardedWebSocketProtocol
