"""OpenAI-style JSON error responses, and the one map from a pipeline outcome to an HTTP
status and error code that every endpoint answers with (chat, speech, transcriptions,
the realtime calls route, and the realtime ``error`` events where they meet the same
outcome)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse

from omnictl.exceptions import (
    AdmissionTimeout,
    InputStalled,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    PipelineDead,
    RealtimeEventError,
    RequestAborted,
    RequestError,
    RequestFailed,
    ServerShutdown,
)
from omnictl.serving.chat.sse import error_body, sse_event

INVALID = "invalid_request_error"


@dataclass(frozen=True)
class ErrorCode:
    """What an outcome is over HTTP: the status, the error object's ``type`` and ``code``."""

    status: int
    kind: str
    code: str


# Most specific first: an outcome answers with the first class it is an instance of.
# tests/serving/common/test_outcomes.py checks every class of the tree has its own line.
OUTCOMES: tuple[tuple[type[Exception], ErrorCode], ...] = (
    (PayloadTooLarge, ErrorCode(413, INVALID, "payload_too_large")),
    # a refused realtime client event carries its own code; over HTTP it is a bad request
    (RealtimeEventError, ErrorCode(400, INVALID, "invalid_request")),
    (InvalidRequest, ErrorCode(400, INVALID, "invalid_request")),
    (AdmissionTimeout, ErrorCode(503, "server_error", "queue_timeout")),  # waited, no slot freed
    # a streamed input's sender ran its window ahead of the entry stage for its whole wait
    (InputStalled, ErrorCode(429, "rate_limit_error", "input_stalled")),
    (Overloaded, ErrorCode(429, "rate_limit_error", "overloaded")),  # over --max-in-flight at once
    (PipelineDead, ErrorCode(503, "server_error", "pipeline_dead")),
    (ServerShutdown, ErrorCode(503, "server_error", "server_shutdown")),
    (RequestAborted, ErrorCode(409, "server_error", "aborted")),
    (RequestFailed, ErrorCode(500, "server_error", "stage_failed")),
    (RequestError, ErrorCode(500, "server_error", "stage_failed")),
)


def error_code(outcome: Exception) -> ErrorCode:
    """The status and code of ``outcome``; a TypeError for an exception that is no outcome."""
    for cls, mapped in OUTCOMES:
        if isinstance(outcome, cls):
            return mapped
    raise TypeError(f"{type(outcome).__name__} is not a pipeline outcome with an HTTP status (see OUTCOMES)")


def _field(outcome: Exception) -> str | None:
    field = getattr(outcome, "field", None)
    return field if isinstance(field, str) else None


def outcome_body(outcome: Exception, message: str | None = None) -> dict[str, object]:
    """The OpenAI error object for ``outcome``: its message (or ``message``), type, code and field."""
    mapped = error_code(outcome)
    return error_body(str(outcome) if message is None else message, mapped.kind, mapped.code, _field(outcome))


def outcome_response(outcome: Exception, message: str | None = None) -> JSONResponse:
    """``outcome`` as the JSON error response of its status."""
    return JSONResponse(outcome_body(outcome, message), status_code=error_code(outcome).status)


def outcome_event(outcome: Exception) -> bytes:
    """``outcome`` as a server-sent ``error`` event (a stream already answered 200)."""
    return sse_event(outcome_body(outcome))


def ended(request_id: str, *, error: str | None, field: str | None, ended_by_server: str | None) -> Exception:
    """The outcome a request's last event stands for. ``error``: the message of an ERROR
    event (None: it was aborted); ``field``: the body field a stage found bad, as the client
    named it; ``ended_by_server``: why the server ended it while stopping."""
    if error is not None and field is not None:  # a stage found the input bad: the client's mistake
        return InvalidRequest(error, field=field)
    if error is not None:
        return RequestFailed(request_id, error)
    if ended_by_server:
        return ServerShutdown(request_id, ended_by_server)
    return RequestAborted(request_id, "the request was aborted")


def field_error(field: str, problem: str) -> InvalidRequest:
    """A bad request naming the body field at fault, in the envelope's wording: 'field' problem."""
    return InvalidRequest(f"'{field}' {problem}", field=field)


def error_response(status: int, message: str, kind: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=status)


def invalid_response(exc: InvalidRequest) -> JSONResponse:
    return outcome_response(exc)


def unauthorized() -> JSONResponse:
    return error_response(
        401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error", "invalid_api_key"
    )
