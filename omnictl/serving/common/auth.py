"""The API key, checked in one place: ``Authorization: Bearer KEY`` (what the openai client
sends), ``X-Api-Key``, or on the WebSocket the subprotocol ``openai-insecure-api-key.<key>``
(a browser cannot set headers on a WebSocket; OpenAI's own browser clients send it so).

Every route that takes input is wrapped in the route table (``omnictl.serving.app``) by
:func:`requires_key` (HTTP) or :func:`requires_key_socket` (WebSocket); the open ones are
:data:`OPEN_ROUTES`, and ``tests/serving/common/test_route_auth.py`` walks the table to keep it so.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from omnictl.serving.common.errors import unauthorized
from omnictl.serving.common.eventstream import EventStreamResponse

if TYPE_CHECKING:
    from omnictl.serving.state import ServingState

KEY_PROTOCOL = "openai-insecure-api-key."
CLOSE_POLICY = 1008
# Routes that answer without the key: the playground page (it holds no data; the page asks
# for the key itself) and /health, whose verdict alone (ok / not ok) is open to a load
# balancer's probe while its details are the key's (it checks :func:`key_presented` itself).
OPEN_ROUTES = frozenset({"/", "/health"})
HttpEndpoint = Callable[[Request], Awaitable[Response | EventStreamResponse]]
SocketEndpoint = Callable[[WebSocket], Awaitable[None]]


def authorized(headers: Mapping[str, str], api_key: str | None) -> bool:
    """True when no key is configured, or the request presents exactly that key."""
    if api_key is None:
        return True
    header = headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        presented = headers.get("x-api-key", "")
    # constant-time comparison: the key must not leak through response timing
    return hmac.compare_digest(presented.strip().encode(), api_key.encode())


def key_presented(connection: HTTPConnection, api_key: str | None) -> bool:
    """:func:`authorized`, plus the WebSocket's key subprotocol on a WebSocket."""
    if authorized(connection.headers, api_key):
        return True
    if connection.scope["type"] != "websocket":
        return False
    assert api_key is not None  # authorized() lets everyone in when no key is set
    header = connection.headers.get("sec-websocket-protocol", "")
    offered = [p.strip() for p in header.split(",") if p.strip()]
    return any(
        p.startswith(KEY_PROTOCOL) and hmac.compare_digest(p[len(KEY_PROTOCOL) :].encode(), api_key.encode())
        for p in offered
    )


def requires_key(state: ServingState, endpoint: HttpEndpoint, *, counted: bool = False) -> HttpEndpoint:
    """``endpoint`` behind the key: a 401 (``invalid_api_key``) without it. ``counted``: the
    refusal is a request outcome (``rejected`` in the metrics), as on the inference routes."""

    async def keyed(request: Request) -> Response | EventStreamResponse:
        if not key_presented(request, state.api_key):
            if counted:
                state.metrics.outcome("rejected")
            return unauthorized()
        return await endpoint(request)

    keyed.requires_key = True  # type: ignore[attr-defined]  # what the route-table test looks for
    keyed.__name__ = getattr(endpoint, "__name__", "keyed")
    return keyed


def requires_key_socket(state: ServingState, endpoint: SocketEndpoint) -> SocketEndpoint:
    """``endpoint`` behind the key: without it the handshake is closed (1008, HTTP 403)."""

    async def keyed(websocket: WebSocket) -> None:
        if not key_presented(websocket, state.api_key):
            state.metrics.outcome("rejected")
            await websocket.close(code=CLOSE_POLICY, reason="missing or wrong API key")
            return
        await endpoint(websocket)

    keyed.requires_key = True  # type: ignore[attr-defined]
    keyed.__name__ = getattr(endpoint, "__name__", "keyed")
    return keyed


def is_keyed(endpoint: object) -> bool:
    """Whether a route's endpoint went through :func:`requires_key` / :func:`requires_key_socket`."""
    return getattr(endpoint, "requires_key", False) is True
