"""OpenAI-style JSON error responses."""

from __future__ import annotations

from starlette.responses import JSONResponse

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.serving.chat.sse import error_body


def field_error(field: str, problem: str) -> InvalidRequest:
    """A bad request naming the body field at fault, in the envelope's wording: 'field' problem."""
    return InvalidRequest(f"'{field}' {problem}", field=field)


def error_response(status: int, message: str, kind: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=status)


def invalid_response(exc: InvalidRequest) -> JSONResponse:
    status = 413 if isinstance(exc, PayloadTooLarge) else 400
    code = "payload_too_large" if status == 413 else "invalid_request"
    return error_response(status, str(exc), "invalid_request_error", code, exc.field)


def unauthorized() -> JSONResponse:
    return error_response(
        401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error", "invalid_api_key"
    )
