"""EventStreamResponse when producing a chunk raises: the request ends and the client is told."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from omnictl.serving.common.eventstream import EventStreamResponse


async def _run(response: EventStreamResponse) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    return sent


def test_a_chunk_that_fails_ends_the_stream_properly_and_calls_on_failure() -> None:
    failures: list[BaseException] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    async def on_failure(exc: BaseException) -> bytes:
        failures.append(exc)
        return b"data: error\n\ndata: [DONE]\n\n"

    async def on_disconnect() -> None:
        raise AssertionError("the client did not leave")

    sent = asyncio.run(_run(EventStreamResponse(chunks(), on_disconnect, on_failure=on_failure)))
    assert [type(e) for e in failures] == [UnicodeEncodeError]
    assert sent[0]["status"] == 200
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"data: first\n\ndata: error\n\ndata: [DONE]\n\n"
    assert sent[-1]["more_body"] is False
