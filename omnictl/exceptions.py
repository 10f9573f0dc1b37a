"""Every exception omnictl raises on purpose.

The tree separates "your input was wrong" from "this request failed" from
"the pipeline itself is broken", so callers can catch exactly what they handle::

    OmnictlError
    ├── TopologyError            the topology file is invalid (carries every problem found)
    ├── TopologyReadError        the topology file cannot be read at all (missing, not UTF-8...)
    ├── YamlTooLarge             a YAML document expands past the value cap (an alias bomb);
    │                            the loader reports it as one yaml-syntax issue
    ├── ResolveError             a dotted path the topology names cannot be imported, or is not
    │                            callable (also an ImportError: says which module, from where, why)
    ├── LaunchError              a stage process could not start (names the stage, shows its
    │                            traceback), or the topology asks for what the runtime lacks
    ├── StartupError             a known reason not to start, in one line with a hint
    │   ├── ListenError          the HTTP port is in use (or cannot be bound)
    │   └── ModelPathError       no --model-path given, or it is not a checkpoint (also a
    │                            FileNotFoundError)
    ├── InvalidRequest           the request's input is malformed (names the field / part)
    │   ├── PayloadTooLarge      a body or input audio part exceeds the server's limits (413)
    │   └── RealtimeEventError   a /v1/realtime client event is refused (an `error` event; the
    │                            session goes on)
    ├── DecodeCancelled          an upload's decode was given up on: the client hung up (never
    │                            answered; it only stops the work)
    ├── RequestError             one request did not produce a result; the pipeline is fine
    │   ├── RequestFailed        a stage raised, a route_fn broke its contract, a deadline passed
    │   └── RequestAborted       the request was aborted (by the client or by `Pipeline.abort`)
    │       └── ServerShutdown   the server ended it while stopping (HTTP 503, not 409)
    ├── RouteContractError       a route_fn returned targets outside its `next` (inside a stage;
    │                            the request then fails with RequestFailed)
    ├── UnknownWireType          a payload names a struct type the receiving process cannot rebuild
    ├── UnsupportedPayload       a payload holds an object the typed encoding cannot carry (names
    │                            its path and type); `allow_pickle: true` lets it through
    ├── Overloaded               admission control refused a request: over --max-in-flight
    │   ├── AdmissionTimeout     it waited --max-queue-wait seconds without a slot freeing
    │   └── InputStalled         a streamed input's send() waited `input_wait` seconds for the
    │                            entry stage to take its earlier chunks (nothing was sent)
    ├── PipelineDead             a stage is down and no restart policy brings it back:
    │                            the pipeline refuses new work
    ├── GroupLost                a rank of a tensor-parallel group died: the group cannot run
    │                            another step (its stage process exits and is restarted whole)
    ├── TraceError               a profiling trace or run directory cannot be found or read
    ├── UnknownFamily            `omnictl models NAME` (or a checkpoint's architecture) names
    │                            no model family omnictl serves (also a LookupError)
    ├── TopologyNotShipped       a family's topology file is not on this machine (a wheel
    │                            without the checkout; also a FileNotFoundError)
    └── BenchError               `omnictl bench` cannot run (bad options, every request rejected)

Every class is defined here, not next to the code that raises it, so this module imports
nothing from omnictl and any module may import it without creating an import cycle.
"""

from __future__ import annotations

import os
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from omnictl.topology.issues import Issue


class OmnictlError(Exception):
    """Base class of every error omnictl raises deliberately."""


class TopologyError(OmnictlError):
    """A topology file failed validation; ``issues`` lists every problem found."""

    def __init__(self, path: str, issues: list[Issue]) -> None:
        self.path = path
        self.issues = list(issues)
        lines = "\n".join(issue.format() for issue in self.issues)
        super().__init__(f"{path}: {len(self.issues)} problem(s)\n{lines}")


class TopologyReadError(OmnictlError):
    """A topology file could not be read at all (missing, a directory, not UTF-8...)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: cannot read topology file: {reason}")


class YamlTooLarge(OmnictlError):
    """A YAML document expands (aliases repeated) to more values than a topology can have."""


class ResolveError(OmnictlError, ImportError):
    """A dotted path in a topology cannot be imported, or names something not callable.

    Also an :class:`ImportError`, so code that guards an import keeps catching it.
    ``reason`` says why (the module that is missing, the attribute that is not there, or
    what the module raised while importing); ``where`` the topology file:line and field
    when known; ``searched`` the directories looked in first.
    """

    def __init__(self, dotted: str, reason: str, *, where: str | None = None, searched: tuple[str, ...] = ()) -> None:
        self.dotted = dotted
        self.reason = reason
        self.where = where
        self.searched = searched
        message = f"cannot use {dotted!r}"
        if where:
            message += f" ({where})"
        message += f": {reason}"
        if searched:
            message += f" [searched {', '.join(searched)}, then sys.path]"
        super().__init__(message)


class LaunchError(OmnictlError):
    """A stage process failed to start; the message names the stage and holds its traceback."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed to start: {message}")


class StartupError(OmnictlError):
    """A known reason the server or a stage cannot start: one line; ``hint`` says what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)


class ListenError(StartupError):
    """The server cannot listen where it was asked to (the port is in use, say)."""


class ModelPathError(StartupError, FileNotFoundError):
    """A stage needs a checkpoint directory: none was given, or it is not one."""


class InvalidRequest(OmnictlError):
    """The request's input is malformed; ``field`` names what was wrong."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class PayloadTooLarge(InvalidRequest):
    """A body or an input audio part exceeds the server's limits (HTTP 413)."""


class RealtimeEventError(InvalidRequest):
    """A ``/v1/realtime`` client event the session cannot take. It never leaves the
    session: it is answered with an ``error`` event naming ``code``, ``field`` (the
    protocol's ``param``) and the client's ``event_id``, and the session goes on."""

    def __init__(
        self,
        message: str,
        code: str,
        param: str | None = None,
        event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message, field=param)
        self.message, self.code, self.param, self.event_id, self.kind = message, code, param, event_id, kind


class DecodeCancelled(OmnictlError):
    """A client media decode was given up on (the client hung up); ``field`` names the upload."""

    def __init__(self, field: str) -> None:
        super().__init__(f"the decode of '{field}' was cancelled: the client is gone")
        self.field = field


class RequestError(OmnictlError):
    """One request ended without a result. The pipeline keeps serving others."""

    def __init__(self, request_id: str, message: str, stage: str | None = None, field: str | None = None) -> None:
        self.request_id = request_id
        self.stage = stage
        self.field = field  # set when a stage found the request's input bad: this field
        super().__init__(message)


class RequestFailed(RequestError):
    """A stage failed this request (its message names the stage and the cause)."""


class RequestAborted(RequestError):
    """The request was aborted before it completed."""


class ServerShutdown(RequestAborted):
    """The server ended the request while stopping (its message says so): HTTP 503, not 409."""


class RouteContractError(OmnictlError):
    """A route_fn returned something other than candidates declared in `next`."""


class UnknownWireType(OmnictlError):
    """A payload names a struct type that the receiving process cannot rebuild."""


class UnsupportedPayload(OmnictlError):
    """A payload between processes holds an object outside the typed encoding."""

    def __init__(self, message: str, *, path: str, type_name: str) -> None:
        self.path = path
        self.type_name = type_name
        super().__init__(message)


class Overloaded(OmnictlError):
    """Too many requests in flight; ``retry_after`` is how many seconds to wait (HTTP 429)."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class AdmissionTimeout(Overloaded):
    """A request waited for admission longer than allowed (HTTP 503)."""


class InputStalled(Overloaded):
    """``RequestHandle.send`` waited its time for the entry stage to take the request's earlier
    chunks (``input_window`` of them were not taken): this chunk was not sent, the input stays
    open. Send it again later, or abort."""


class PipelineDead(OmnictlError):
    """A stage process is down and will not come back; new work is refused."""


class GroupLost(OmnictlError):
    """A rank of a tensor-parallel group died: the group cannot run another step."""


class TraceError(OmnictlError):
    """A trace could not be found or read (missing run directory, unknown request id)."""


class BenchError(OmnictlError):
    """The bench could not run (bad options, or the server rejects every request)."""


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frame's file name and line, enough to find the bug.

    Only the file's name: this text reaches clients, and a full path tells any caller
    where the server is installed (the stage's log has the whole traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


class UnknownFamily(OmnictlError, LookupError):
    """``omnictl models NAME`` with a name no family has."""


class TopologyNotShipped(OmnictlError, FileNotFoundError):
    """A family's topology file is not on this machine (omnictl installed from a wheel)."""
