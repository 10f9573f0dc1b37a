"""The WebRTC transport when it can run, or a stand-in that says why it cannot.

``aiortc`` comes with the ``demo`` extra; a server installed without it still serves the
WebSocket, and ``POST /v1/realtime/calls`` answers 501 naming what to install.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from omnictl.serving.common.errors import error_response
from omnictl.serving.realtime.channel import RealtimeHub


class CallsLike(Protocol):
    async def create(self, request: Request) -> Response: ...
    async def hangup(self, request: Request) -> Response: ...
    async def close_all(self) -> None: ...
    def stats(self) -> dict[str, int]: ...


class _NoWebRTC:
    def __init__(self, hub: RealtimeHub, why: str) -> None:
        self.hub, self.why = hub, why

    async def create(self, request: Request) -> Response:
        return error_response(
            501,
            f"WebRTC is not available on this server ({self.why}); install it with pip install 'omnictl[demo]' "
            "(aiortc), or use the WebSocket at /v1/realtime",
            "server_error",
            "webrtc_unavailable",
        )

    async def hangup(self, request: Request) -> Response:
        return await self.create(request)

    async def close_all(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {
            "sessions": self.hub.open,
            "websocket_sessions": self.hub.by_transport["websocket"],
            "webrtc_sessions": 0,
            "peer_connections": 0,
        }


def webrtc_calls(hub: RealtimeHub) -> CallsLike:
    try:
        from omnictl.serving.realtime.webrtc import Calls
    except ModuleNotFoundError as exc:  # only a missing package; anything else wrong in the module is raised
        if exc.name is None or exc.name.split(".")[0] not in ("aiortc", "aioice", "pylibsrtp", "pyee"):
            raise
        return _NoWebRTC(hub, f"the package {exc.name.split('.')[0]!r} is not installed")
    return Calls(hub)
