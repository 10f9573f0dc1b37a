"""Every exception omnictl raises on purpose.

The tree separates "your input was wrong" from "this request failed" from
"the pipeline itself is broken", so callers can catch exactly what they handle::

    OmnictlError
    ├── TopologyError            the topology file is invalid (carries every problem found)
    ├── LaunchError              a stage process could not start (names the stage, shows its traceback)
    ├── InvalidRequest           the request's input is malformed (names the field / part)
    ├── RequestError             one request did not produce a result; the pipeline is fine
    │   ├── RequestFailed        a stage raised, a route_fn broke its contract, a deadline passed
    │   └── RequestAborted       the request was aborted (by the client or by `Pipeline.abort`)
    └── PipelineDead             a stage is down and no restart policy brings it back:
                                 the pipeline refuses new work
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from omnictl.topology.issues import Issue


class OmnictlError(Exception):
    """Base class of every error omnictl raises deliberately."""


class TopologyError(OmnictlError):
    """A topology file failed validation; ``issues`` lists every problem found."""

    def __init__(self, path: str, issues: "list[Issue]") -> None:
        self.path = path
        self.issues = list(issues)
        lines = "\n".join(issue.format() for issue in self.issues)
        super().__init__(f"{path}: {len(self.issues)} problem(s)\n{lines}")


class LaunchError(OmnictlError):
    """A stage process failed to start; the message names the stage and holds its traceback."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed to start: {message}")


class InvalidRequest(OmnictlError):
    """The request's input is malformed; ``field`` names what was wrong."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class RequestError(OmnictlError):
    """One request ended without a result. The pipeline keeps serving others."""

    def __init__(self, request_id: str, message: str, stage: str | None = None) -> None:
        self.request_id = request_id
        self.stage = stage
        super().__init__(message)


class RequestFailed(RequestError):
    """A stage failed this request (its message names the stage and the cause)."""


class RequestAborted(RequestError):
    """The request was aborted before it completed."""


class PipelineDead(OmnictlError):
    """A stage process is down and will not come back; new work is refused."""
