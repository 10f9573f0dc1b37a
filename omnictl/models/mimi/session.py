"""A scheduler for stages that keep state per request across a whole stream (a session).

Mimi's streaming encoder and decoder, and Moshi's temporal and depth transformers, each
hold something per request that every frame updates (convolution padding, KV caches, the
frame in flight): a stateless window (:class:`~omnictl.schedulers.streaming.StreamingScheduler`)
cannot carry it. Here every message of a request (stream chunks, stream end, the
upstream's result, and chunks handed in by a sibling stage of the process) is handled in
arrival order, in the stage's one worker thread, by :meth:`SessionScheduler.handle` with
that request's state, made by :meth:`SessionScheduler.open` at its first message. A
subclass streams with :meth:`stream` and ends the request with :meth:`finish`; the state
is dropped when the request finishes, fails or is aborted (``held`` then counts nothing).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.logs import request_scope
from omnictl.recent import RecentIds
from omnictl.schedulers.base import IncomingMessage, OutgoingKind, OutgoingMessage, SchedulerLoad
from omnictl.schedulers.worker import WorkerScheduler


@dataclass(slots=True)
class _Session:
    params: Mapping[str, Any]
    state: Any = None
    opened: bool = False
    done: bool = False  # finished, failed or aborted: its queued messages are skipped


class SessionScheduler(WorkerScheduler):
    """Per-request state, every message handled in order in one worker thread."""

    worker_name = "session"

    def __init__(self) -> None:
        super().__init__()
        self._sessions: dict[str, _Session] = {}
        self._ended = RecentIds()  # late messages for these are ignored

    @abstractmethod
    def open(self, request_id: str, params: Mapping[str, Any]) -> Any:
        """The state of a new request (worker thread)."""

    @abstractmethod
    def handle(self, request_id: str, state: Any, message: IncomingMessage) -> None:
        """One message of the request (worker thread): call :meth:`stream` / :meth:`finish`."""

    def stream(self, request_id: str, data: Any) -> None:
        self.emit(OutgoingMessage(OutgoingKind.STREAM, request_id, data))

    def finish(self, request_id: str, result: Any) -> None:
        """The request's result; its state is dropped."""
        session = self._sessions.get(request_id)
        if session is None or session.done:
            return
        session.done = True
        self.emit(OutgoingMessage(OutgoingKind.RESULT, request_id, result))
        self._drop(request_id)

    def _drop(self, request_id: str) -> None:
        loop = self._loop
        if loop is None:
            raise RuntimeError("scheduler not started")
        loop.call_soon_threadsafe(self._forget, request_id)

    def _forget(self, request_id: str) -> None:
        self._sessions.pop(request_id, None)
        self._ended.add(request_id)

    # --- event loop --------------------------------------------------------------------

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._ended:
            return
        session = self._sessions.get(rid)
        if session is None:
            session = self._sessions[rid] = _Session(params=message.params)
        self.submit(self._job, rid, session, message)

    def abort(self, request_id: str) -> None:
        session = self._sessions.pop(request_id, None)
        if session is not None:
            session.done = True
            session.state = None  # its caches go now, not when the queued jobs have run
        self._ended.add(request_id)

    def load(self) -> SchedulerLoad:
        running = len(self._sessions)
        return SchedulerLoad(queued=self.jobs(), running=running, stream_buffers=running)

    # --- worker thread -----------------------------------------------------------------

    def _job(self, rid: str, session: _Session, message: IncomingMessage) -> None:
        if session.done:
            return
        try:
            with request_scope(rid), self.busy():
                if not session.opened:
                    session.state, session.opened = self.open(rid, session.params), True
                self.handle(rid, session.state, message)
        except Exception as exc:
            session.done = True
            session.state = None
            field = exc.field if isinstance(exc, InvalidRequest) else None
            error = f"stage {self.stage_name}: {type(exc).__name__}: {exc}"
            self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=error, field=field, exc=exc))
            self._drop(rid)
