"""``GET /``: the playground, one static page (no build step, nothing fetched from elsewhere)
that talks to ``/v1/realtime`` from the browser — over WebRTC (``POST /v1/realtime/calls``)
when the browser has ``RTCPeerConnection``, the WebSocket otherwise or with
``?transport=websocket``, and shows which: push-to-talk or hands-free (server VAD),
typed questions, the conversation, the answer's audio played as it streams, the time from
the end of speech to the first audio of each answer, and an interrupt button."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse


@lru_cache(maxsize=1)
def html() -> str:
    return files("omnictl.serving").joinpath("static").joinpath("playground.html").read_text(encoding="utf-8")


async def page(request: Request) -> HTMLResponse:
    # The page holds no secret: the API key is typed by the user and kept in the browser.
    return HTMLResponse(html(), headers={"Cache-Control": "no-cache"})
