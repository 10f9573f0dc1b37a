"""A request as the caller sees it: a handle with an event stream and a result."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from omnictl.exceptions import RequestAborted, RequestError


class RequestState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class RequestEventKind(str, enum.Enum):
    """What a :class:`RequestEvent` reports."""

    STREAM = "stream"  # a terminal's stream chunk (``data``)
    RESULT = "result"  # a terminal's result (``data``)
    ERROR = "error"  # the request failed (``error``, ``stage``); ends the events
    ABORTED = "aborted"  # the request was aborted; ends the events


@dataclass(frozen=True)
class RequestEvent:
    """One step of a request as its caller sees it. For a ``text`` / ``audio`` terminal,
    ``data`` is an :mod:`omnictl.outputs` type (checked by the stage that sent it)."""

    kind: RequestEventKind
    stage: str | None
    data: Any = None
    error: str | None = None
    field: str | None = None  # ERROR: the request's field a stage found bad (the client's mistake)


@dataclass
class RequestRecord:
    """The coordinator's single truth about one request."""

    request_id: str
    expected: set[str]  # terminals still to report
    active: tuple[str, ...]
    deadline: float  # loop time
    state: RequestState = RequestState.PENDING
    # The id the stages know this attempt by: the request id, then ``ID~N`` for its Nth
    # replay (the stages remember every aborted id as finished and drop what carries it).
    wire_id: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # the context's params, for a replay
    # The entry's inputs, held while a replay could still need them: until the caller has
    # seen output (then a replay would repeat it) or the request ends.
    inputs: Any = None
    replays: int = 0  # how often it was re-run from the entry after a replica died
    output_sent: bool = False  # the caller has seen a stream chunk or a result
    caller_streams: bool = True  # False: the caller reads only the results, at the end
    # What the caller has of each autoregressive terminal (its TokenDelta chunks' token ids),
    # while every output it saw was such a chunk: a death then resumes the stream with them
    # forced as the prefix. None: it saw something else (a result, another chunk): no resume.
    sent_tokens: dict[str, list[int]] | None = field(default_factory=dict)
    resumes: int = 0  # how many of its replays were resumes
    results: dict[str, Any] = field(default_factory=dict)
    events: asyncio.Queue[RequestEvent | None] = field(default_factory=asyncio.Queue)  # None closes it
    outcome: asyncio.Future[dict[str, Any]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        self.wire_id = self.wire_id or self.request_id

    @property
    def finished(self) -> bool:
        return self.state in (RequestState.COMPLETED, RequestState.FAILED, RequestState.ABORTED)

    def finish(self, state: RequestState, error: RequestError | None = None) -> None:
        self.state = state
        self.inputs = None
        if error is None:
            self.outcome.set_result(dict(self.results))
        else:
            kind = RequestEventKind.ABORTED if isinstance(error, RequestAborted) else RequestEventKind.ERROR
            self.events.put_nowait(RequestEvent(kind, error.stage, error=str(error), field=error.field))
            self.outcome.set_exception(error)
            self.outcome.exception()  # mark retrieved: not awaiting the result is fine
        self.events.put_nowait(None)


class RequestHandle:
    """Returned by ``Pipeline.submit``."""

    def __init__(self, record: RequestRecord, abort: Callable[[str], Any]) -> None:
        self._record = record
        self._abort = abort
        self.id = record.request_id

    @property
    def state(self) -> RequestState:
        return self._record.state

    async def events(self) -> AsyncIterator[RequestEvent]:
        """Each terminal's stream chunks (in order) then its result; an error or aborted
        event ends the stream early. Iterate once per request."""
        while True:
            event = await self._record.events.get()
            if event is None:
                return
            yield event

    async def result(self) -> dict[str, Any]:
        """``{terminal_stage: data}``; raises RequestFailed / RequestAborted."""
        return await asyncio.shield(self._record.outcome)

    async def abort(self) -> None:
        await self._abort(self.id)

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the request has ended (completed, failed or aborted)."""
        self._record.outcome.add_done_callback(lambda _: callback())
