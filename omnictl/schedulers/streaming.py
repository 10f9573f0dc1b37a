"""Streaming scheduler: turns an upstream's stream of increments into output as it comes.

For vocoders (codec codes to waveform) and speech synthesis (text deltas to speech,
sentence by sentence). Each request keeps a buffer of *units* (codes, characters)
taken from its stream chunks. As soon as enough units wait, they go to
``process_chunk`` as one :class:`Window`, with up to ``left_context`` units that were
already processed before them as context, and what it returns is emitted at once as a
``stream`` output. When the stream ends, what is left goes out as the final window and
``finish`` builds the request's ``result`` from all outputs.

A window is ``chunk_size`` units, or whatever ``split`` says (one whole sentence, say);
the last window of a stream may be shorter.
The stream ends on ``stream_done`` (``finish_on="stream_done"``: for a stage that only
receives the stream), or on the ``new_request`` that carries the upstream's final result
(``finish_on="request"``: for a stage that is both a ``stream_to`` and a ``next`` target,
which receives chunks, then stream-done, then that request). A ``new_request`` for a
request that streamed nothing is taken as its whole input.

Callbacks run in one worker thread, in arrival order, so the event loop stays free
(:class:`~omnictl.schedulers.worker.WorkerScheduler`).

Hooks: a model adapts this scheduler through its constructor's public callbacks
(``process_chunk``, ``split``, ``units``, ``finish``), not by subclassing it; each
request's parameters reach them as :attr:`Window.params` / ``finish``'s ``params``.
"""

from __future__ import annotations

import enum
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from omnictl.exceptions import InvalidRequest
from omnictl.logs import request_scope
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.profiling.events import EventKind
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    SchedulerLoad,
)
from omnictl.schedulers.worker import WorkerScheduler


class FinishOn(str, enum.Enum):
    """What ends a request's stream here (a str enum: the plain strings are accepted)."""

    STREAM_DONE = "stream_done"  # the upstream's stream-done (a stage that only receives the stream)
    REQUEST = "request"  # the new_request carrying the upstream's result (a stream_to and next target)


@dataclass(frozen=True, slots=True)
class Window:
    """What ``process_chunk`` gets: new units, with the units processed just before as context."""

    request_id: str
    params: Mapping[str, Any]  # the request's parameters (sampling, voice, modalities)
    context: Any  # up to `left_context` units already processed (empty at first)
    new: Any  # units never processed before
    index: int  # 0 for a request's first window
    final: bool  # the stream has ended; nothing follows this window


ProcessChunk = Callable[[Window], "Mapping[str, Any] | None"]
Finish = Callable[[str, Mapping[str, Any], "list[Mapping[str, Any]]"], Mapping[str, Any]]


@dataclass(slots=True)
class _Stream:
    params: Mapping[str, Any]
    pending: Any = None  # units waiting to be processed
    context: Any = None  # tail of what was processed, for the next window
    windows: int = 0
    outputs: list[Mapping[str, Any]] = field(default_factory=list)  # touched by the worker only
    failed: bool = False
    compute_seconds: float = 0.0


class StreamingScheduler(WorkerScheduler):
    worker_name = "stream"

    def __init__(
        self,
        process_chunk: ProcessChunk,
        *,
        left_context: int = 0,
        chunk_size: int = 1,
        split: Callable[[Any], int] | None = None,
        units: str | Callable[[Any], Any] = "token_ids",
        finish: Finish | None = None,
        finish_on: FinishOn | Literal["stream_done", "request"] = FinishOn.STREAM_DONE,
        flush_on_end: bool = False,
    ) -> None:
        """
        process_chunk: ``Window -> dict | None``; a dict is emitted as a stream output.
        left_context: how many already-processed units each window carries as context.
        chunk_size: process as soon as this many new units wait (ignored when ``split`` is given).
        split: ``pending units -> n``: the first ``n`` waiting units make the next window (0: wait
            for more); asked again until it says 0. E.g. the length of the first whole sentence.
        units: the key of a stream chunk's dict holding its units, or a function of the chunk
            data returning them (a str, list, numpy array or torch tensor, concatenated along dim 0).
        finish: ``(request_id, params, outputs) -> result``; default :func:`merge_outputs`.
        finish_on: what ends a request's stream (see :class:`FinishOn`).
        flush_on_end: when a stream that had windows ends with no units waiting, still call
            ``process_chunk`` once with an empty final window (its context the last units):
            a codec that holds its last frames back until it sees the frames after them
            (a look-ahead) gives them out then. Needs ``left_context`` > 0.
        """
        super().__init__()
        if left_context < 0 or chunk_size < 1:
            raise ValueError(f"need left_context >= 0 and chunk_size >= 1, got {left_context}, {chunk_size}")
        if flush_on_end and left_context == 0:
            raise ValueError("flush_on_end needs left_context > 0 (the final window's context is what it flushes)")
        self.flush_on_end = flush_on_end
        try:
            self.finish_on = FinishOn(finish_on)
        except ValueError:
            raise ValueError(f"finish_on must be 'stream_done' or 'request', got {finish_on!r}") from None
        self.process_chunk = process_chunk
        self.left_context = left_context
        self.chunk_size = chunk_size
        self.split = split
        self.units = units
        self.finish = finish if finish is not None else (lambda _rid, _params, outputs: merge_outputs(outputs))
        self._streams: dict[str, _Stream] = {}
        self._ended = RecentIds()  # ended, failed or aborted: late messages for them are ignored

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.failed = True  # jobs already queued for it skip their work
        self._ended.add(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(queued=self.jobs(), running=len(self._streams), stream_buffers=len(self._streams))

    # --- event-loop side: buffering and windowing --------------------------------------

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._ended:
            return
        stream = self._streams.get(rid)
        if message.kind is IncomingKind.STREAM_CHUNK:
            if stream is None:
                stream = self._streams[rid] = _Stream(params=message.params)
            self._add_units(rid, stream, message.data)
        elif message.kind is IncomingKind.STREAM_DONE:
            if self.finish_on is FinishOn.STREAM_DONE:
                self._end(rid, stream if stream is not None else _Stream(params=message.params))
        else:  # the upstream's final result
            if stream is None:  # nothing streamed: the result is the whole input
                stream = _Stream(params=message.params)
                self._add_units(rid, stream, message.data)
            self._end(rid, stream)

    def _add_units(self, rid: str, stream: _Stream, data: Any) -> None:
        try:
            units = data[self.units] if isinstance(self.units, str) else self.units(data)
            stream.pending = _concat(stream.pending, units)
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(rid, stream, f"stream chunk has no usable units ({self.units!r}): {exc!r}")
            return
        while (size := self._next_window_size(stream.pending)) > 0:
            self._submit_window(rid, stream, stream.pending[:size], final=False)
            stream.pending = stream.pending[size:]

    def _next_window_size(self, pending: Any) -> int:
        if self.split is not None:
            return self.split(pending)
        return self.chunk_size if len(pending) >= self.chunk_size else 0

    def _end(self, rid: str, stream: _Stream) -> None:
        self._streams.pop(rid, None)
        self._ended.add(rid)
        if stream.pending is not None and len(stream.pending) > 0:
            self._submit_window(rid, stream, stream.pending, final=True)
            stream.pending = None
        elif self.flush_on_end and stream.context is not None:
            self._submit_window(rid, stream, stream.context[:0], final=True)
        self.submit(self._finish_job, rid, stream)

    def _submit_window(self, rid: str, stream: _Stream, new: Any, *, final: bool) -> None:
        context = stream.context if stream.context is not None else new[:0]
        window = Window(rid, stream.params, context, new, stream.windows, final)
        stream.windows += 1
        if self.left_context > 0:
            joined = _concat(context, new)
            stream.context = joined[max(len(joined) - self.left_context, 0) :]
        self.submit(self._process_job, window, stream)

    def _fail(self, rid: str, stream: _Stream, reason: str) -> None:
        stream.failed = True
        self._streams.pop(rid, None)
        self._ended.add(rid)
        self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}"))

    # --- worker thread: the callbacks ----------------------------------------------------

    def _process_job(self, window: Window, stream: _Stream) -> None:
        if stream.failed:
            return
        started = time.perf_counter()
        output = self._call(window.request_id, stream, "process_chunk", lambda: self.process_chunk(window))
        stream.compute_seconds += time.perf_counter() - started
        if output is None or stream.failed:
            return
        if not stream.outputs:
            self.profile(EventKind.FIRST_EMIT, window.request_id)
        stream.outputs.append(output)
        self.emit(OutgoingMessage(OutgoingKind.STREAM, window.request_id, output))

    def _finish_job(self, rid: str, stream: _Stream) -> None:
        if stream.failed:
            return
        self.profile(EventKind.DECODE_STEPS, rid, steps=stream.windows, seconds=stream.compute_seconds)
        result = self._call(rid, stream, "finish", lambda: self.finish(rid, stream.params, stream.outputs))
        if result is not None and not stream.failed:
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def _call(self, rid: str, stream: _Stream, what: str, call: Callable[[], Any]) -> Any:
        try:
            with request_scope(rid):  # what the callback logs carries the request's id
                return call()
        except Exception as exc:
            stream.failed = True
            field = exc.field if isinstance(exc, InvalidRequest) else None
            self.emit(
                OutgoingMessage(
                    OutgoingKind.ERROR,
                    rid,
                    error=f"stage {self.stage_name}: {what} failed: {type(exc).__name__}: {exc}",
                    field=field,
                    exc=exc,
                )
            )
            return None


def _concat(head: Any, tail: Any) -> Any:
    """``head`` followed by ``tail`` (str, list, tuple, numpy array or torch tensor; None is empty)."""
    if head is None:
        return tail if not isinstance(tail, tuple) else list(tail)
    if isinstance(head, str):
        return head + tail
    if isinstance(head, list):
        return head + list(tail)
    if isinstance(head, np.ndarray):
        return np.concatenate([head, np.asarray(tail)])
    import torch  # only tensors lead here; the vocoder stages import torch anyway

    return torch.cat([head, torch.as_tensor(tail)])


def merge_outputs(outputs: Sequence[Any]) -> Any:
    """The default result: the stream outputs joined.

    :class:`~omnictl.outputs.AudioChunk` outputs become one
    :class:`~omnictl.outputs.AudioResult` (the whole waveform, the transcripts joined) and
    :class:`~omnictl.outputs.TextDelta` outputs one :class:`~omnictl.outputs.TextResult`,
    so a streaming ``audio`` / ``text`` terminal needs no ``finish`` of its own. Dicts are
    joined key by key: arrays and tensors concatenated, strings joined, lists chained, any
    other value the last one seen.
    """
    if outputs and all(isinstance(output, AudioChunk) for output in outputs):
        return AudioResult(
            samples=np.concatenate([output.samples for output in outputs]),
            sample_rate=outputs[-1].sample_rate,
            transcript="".join(output.transcript for output in outputs),
        )
    if outputs and all(isinstance(output, TextDelta) for output in outputs):
        return TextResult(text="".join(output.text for output in outputs))
    merged: dict[str, Any] = {}
    for output in outputs:
        if not isinstance(output, Mapping):
            raise TypeError(f"cannot merge a {type(output).__name__} with the other outputs; pass finish=")
        for key, value in output.items():
            if key in merged and (isinstance(value, (str, list, np.ndarray)) or _is_tensor(value)):
                merged[key] = _concat(merged[key], value)
            else:
                merged[key] = value
    return merged


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    return torch is not None and isinstance(value, torch.Tensor)
