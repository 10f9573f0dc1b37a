"""An ASGI streaming response (server-sent events, or a raw audio stream) that notices a
client leaving at once.

Starlette's StreamingResponse on ASGI spec 2.4 only finds out that the client left
when a write fails; a request waiting for its first token would hold pipeline
state until then. This response watches ``http.disconnect`` while it streams and
calls ``on_disconnect`` (which aborts the request everywhere) the moment it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Awaitable, Callable, Mapping

from starlette.types import Receive, Scope, Send


class EventStreamResponse:
    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        on_disconnect: Callable[[], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream; charset=utf-8",
        on_failure: Callable[[BaseException], Awaitable[bytes]] | None = None,
    ) -> None:
        self.chunks = chunks
        self.on_disconnect = on_disconnect
        # Called when producing a chunk raised: it ends the request (freeing it) and returns
        # the closing bytes for the client (an error event and [DONE]), instead of a 200
        # with a cut body and a request that is never removed.
        self.on_failure = on_failure
        self.headers = dict(headers or {})
        self.media_type = media_type

    async def _pump(self, send: Send) -> None:
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers = [(b"content-type", self.media_type.encode("latin-1")), (b"cache-control", b"no-cache")]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
        pump = asyncio.create_task(self._pump(send))
        watch = asyncio.create_task(self._watch(receive))
        await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        client_left = not pump.done() or isinstance(pump.exception(), OSError)
        failed = None if client_left or not pump.done() else pump.exception()
        for task in (pump, watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                if task is not pump or failed is None:
                    await task
        if failed is not None:
            closing = await self.on_failure(failed) if self.on_failure is not None else b""
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": closing, "more_body": False})
            if self.on_failure is None:
                raise failed
            return
        if client_left:
            with contextlib.suppress(RuntimeError):  # generator already closed by cancellation
                await self.chunks.aclose()  # type: ignore[attr-defined]  # an async generator (checked above) has aclose; AsyncIterator does not say so
            await self.on_disconnect()
