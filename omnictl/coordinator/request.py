"""A request as the caller sees it: a handle with an event stream and a result."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from omnictl import messages as m
from omnictl.exceptions import InvalidRequest, RequestAborted, RequestError


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
    # When the coordinator had it (monotonic ns): a caller that reads the stream late (a held
    # preemptive answer) still knows when each step happened.
    at_ns: int = dataclasses.field(default_factory=time.monotonic_ns, compare=False)  # `field`: the attribute above


@dataclass
class InputStream:
    """A request whose input arrives over time (``Pipeline.submit(..., input_stream=True)``):
    where its chunks go, and how far the caller got. The coordinator keeps only this; the
    chunks themselves go from the caller's process to the entry stage over the data plane."""

    context: m.RequestContext  # the context every chunk carries
    entry: str  # the entry stage
    instance: str  # the OS process (replica) of the entry stage the request was placed on
    sent: int = 0  # chunks sent so far: the next chunk's seq
    ended: bool = False  # the caller ended its input (StreamDone sent)
    taken: int = 0  # chunks the entry's scheduler has taken (InputTaken), of this attempt

    @property
    def in_flight(self) -> int:
        """Chunks sent that the entry's scheduler has not taken yet."""
        return self.sent - self.taken


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
    first_marked: set[str] = field(default_factory=set)  # terminals whose first output the trace marked
    caller_streams: bool = True  # False: the caller reads only the results, at the end
    # What the caller has of each autoregressive terminal (its TokenDelta chunks' token ids),
    # while every output it saw was such a chunk: a death then resumes the stream with them
    # forced as the prefix. None: it saw something else (a result, another chunk): no resume.
    sent_tokens: dict[str, list[int]] | None = field(default_factory=dict)
    resumes: int = 0  # how many of its replays were resumes
    input_stream: InputStream | None = None  # its input arrives over time (None: whole at submit)
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


class InputChannel(Protocol):
    """How a handle's :meth:`RequestHandle.send` and :meth:`RequestHandle.end_input` reach
    the data plane: the coordinator's shell implements it."""

    def send_input(self, record: RequestRecord, data: Any) -> None: ...

    def end_input(self, record: RequestRecord) -> None: ...

    async def input_credit(self, record: RequestRecord, timeout: float | None) -> None: ...


class RequestHandle:
    """Returned by ``Pipeline.submit``."""

    def __init__(
        self, record: RequestRecord, abort: Callable[[str], Awaitable[None]], inputs: InputChannel | None = None
    ) -> None:
        self._record = record
        self._abort = abort
        self._inputs = inputs
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

    async def send(self, data: Any, *, timeout: float | None = None) -> None:
        """Send the next chunk of a streamed input (a request submitted with
        ``input_stream=True``): it reaches the entry stage as a stream chunk, after every
        chunk sent before it. Raises the request's own error (:class:`RequestAborted`,
        :class:`RequestFailed`) once it has ended that way, :class:`InvalidRequest` (field
        ``input``) when it takes no streamed input, its input was ended or it completed, and
        :class:`UnsupportedPayload` for data the data plane cannot carry (nothing is sent;
        the input stays open).

        Backpressure: while ``input_window`` chunks (a launch knob, 64 by default) are sent
        and not yet taken by the entry stage's scheduler, it waits for the stage to take one;
        after ``timeout`` seconds (default: the launch's ``input_wait``, 30 s) it raises
        :class:`InputStalled` (nothing is sent; the input stays open)."""
        self._check_open("send a chunk to")
        assert self._inputs is not None  # _check_open: an input stream has its channel
        await self._inputs.input_credit(self._record, timeout)
        self._check_open("send a chunk to")  # it may have ended while this waited
        self._inputs.send_input(self._record, data)

    @property
    def input_in_flight(self) -> int:
        """Chunks of a streamed input sent that the entry stage has not taken yet (0 otherwise)."""
        stream = self._record.input_stream
        return 0 if stream is None else stream.in_flight

    async def end_input(self) -> None:
        """End a streamed input: the entry stage gets the stream's end (stream done) after
        the last chunk. Raises as :meth:`send`; a second call is an :class:`InvalidRequest`."""
        self._check_open("end the input of")
        assert self._inputs is not None
        self._inputs.end_input(self._record)

    def _check_open(self, what: str) -> None:
        record = self._record
        if record.input_stream is None or self._inputs is None:
            raise InvalidRequest(
                f"cannot {what} request {self.id}: its input was whole at submit "
                "(submit it with input_stream=True to stream its input)",
                field="input",
            )
        error = record.outcome.exception() if record.outcome.done() else None
        if error is not None:  # it failed or was aborted: say so, as its result() would
            raise error
        if record.finished:
            raise InvalidRequest(f"cannot {what} request {self.id}: it has completed", field="input")
        if record.input_stream.ended:
            raise InvalidRequest(f"cannot {what} request {self.id}: its input was already ended", field="input")

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the request has ended (completed, failed or aborted)."""
        self._record.outcome.add_done_callback(lambda _: callback())
