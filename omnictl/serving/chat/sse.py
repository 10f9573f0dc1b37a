"""Server-sent events framing for streamed chat completions."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event; JSON never contains a raw newline, so one line suffices."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def error_body(message: str, kind: str, code: str | int | None = None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object; the `openai` client raises APIError when it sees one mid-stream."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse_error(message: str, kind: str, code: str | int | None = None) -> bytes:
    return sse_event(error_body(message, kind, code))
