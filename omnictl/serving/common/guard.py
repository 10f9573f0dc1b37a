"""Host and Origin checks: what a web page the user visits may not do with this server.

- ``Host``: a DNS-rebinding page (``attacker.example`` re-pointed at 127.0.0.1) reaches
  every route same-origin, so the ``Host`` header must name this server: an IP address
  literal (a rebinding needs a name), ``localhost`` (any port), or a name in
  ``--allowed-hosts``. Otherwise 421 ``misdirected_request``.
- ``Origin``: browsers apply no CORS to WebSockets, and a form may POST
  ``multipart/form-data`` cross-origin without a preflight. A request (HTTP or
  WebSocket) that carries an ``Origin`` must come from the server's own origin (the
  Origin's host and port are the ``Host`` it was sent to) or one in ``--allowed-origins``;
  otherwise 403 ``forbidden_origin`` (a WebSocket is refused in its handshake). Clients
  that are not browsers send no ``Origin`` and are not affected.

``"*"`` in either list allows anything (behind a proxy that checks them itself).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from omnictl.serving.common.echo import clip
from omnictl.serving.common.errors import error_response

_LOOPBACK_NAMES = frozenset({"localhost"})


def _split_host(value: str) -> tuple[str, str]:
    """(host lowercased without brackets, port or '') of a Host header or an origin's netloc."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest.lstrip(":")
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class RequestGuard:
    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def for_bind(
        cls, host: str, port: int, allowed_hosts: tuple[str, ...] = (), allowed_origins: tuple[str, ...] = ()
    ) -> RequestGuard:
        hosts = {h.strip().lower() for h in allowed_hosts if h.strip()}
        if not _is_ip(host.strip("[]")) and host not in _LOOPBACK_NAMES:
            hosts.add(host.lower())  # bound by name: that name is this server
        return cls(frozenset(hosts), frozenset(o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()))

    def host_allowed(self, header: str) -> bool:
        if "*" in self.allowed_hosts:
            return True
        host, _port = _split_host(header)
        if not host:
            return False
        return (
            _is_ip(host)
            or host in _LOOPBACK_NAMES
            or host in self.allowed_hosts
            or header.strip().lower() in self.allowed_hosts
        )

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        if "*" in self.allowed_origins:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file:// page) is no one's own origin
        return _split_host(parts.netloc) == _split_host(host_header) or parts.netloc == host_header.strip().lower()


class GuardMiddleware:
    """Refuses requests whose Host or Origin fails :class:`RequestGuard` before any route runs."""

    def __init__(self, app: ASGIApp, guard: RequestGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        problem: tuple[int, str, str] | None = None
        if not self.guard.host_allowed(host):
            problem = (
                421,
                f"Host {clip(host, 100)!r} is not this server's (use its address, or start it with "
                "--allowed-hosts NAME)",
                "misdirected_request",
            )
        elif origin is not None and not self.guard.origin_allowed(origin.decode("latin-1"), host):
            problem = (
                403,
                f"requests from the web origin {clip(origin.decode('latin-1'), 100)!r} are not allowed "
                "(start the server with --allowed-origins ORIGIN to allow it)",
                "forbidden_origin",
            )
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, message, code = problem
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        await error_response(status, message, "invalid_request_error", code, "Origin" if status == 403 else "Host")(
            scope, receive, send
        )
