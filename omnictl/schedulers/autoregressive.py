"""Continuous-batching autoregressive scheduler (thinker, talker, any causal LM).

All model compute runs in one worker thread so the event loop stays free for IO. The
worker loops: apply what the loop sent (new requests, stream increments, aborts),
prefill newly admitted requests one by one, then advance every running request by one
token in a single batched decode step. A request joins the batch between two steps and
leaves it when it finishes; its KV cache is released on finish and on abort.

Outputs, per request:

- ``stream`` every ``stream_every`` tokens: ``{"token_ids": [...], "text": "<delta>"}``
  plus ``"hidden"`` (``[n, H]``) when ``emit_hidden``; ``hidden[i]`` is the state that
  produced ``token_ids[i]`` (for the first token, the prompt's last position);
- ``result``: ``{"token_ids", "text", "prompt_tokens", "completion_tokens",
  "finish_reason": "stop" | "length"}`` (plus all ``"hidden"`` rows when ``emit_hidden``).
  A stop token ends the request but is not in ``token_ids`` (it counts in
  ``completion_tokens``); a stop string is cut from ``text`` and never streamed.

Upstream streams (a talker fed by the thinker's hidden states): when the runner also
implements :class:`StreamFedRunner`, ``stream_chunk`` / ``stream_done`` data is passed
to ``runner.feed`` and a request only prefills or decodes while ``runner.ready`` says
so. With ``start_on="stream"`` the first chunk starts the request, and a later
``new_request`` (the upstream's final result) is fed as the last increment. Runners
without ``feed`` ignore stream messages and start from ``new_request`` alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from functools import partial
from typing import Any, Literal, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.profiling.events import EventKind
from omnictl.schedulers.ar_request import ArRequest
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from omnictl.schedulers.runner import AutoregressiveRunner, StreamFedRunner
from omnictl.schedulers.sampling import SamplingParams

_FINISHED_MEMORY = 4096  # finished request ids remembered (stream mode) so late messages do not restart them

__all__ = ["AutoregressiveScheduler", "StreamFedRunner"]


class AutoregressiveScheduler(Scheduler):
    def __init__(
        self,
        runner: AutoregressiveRunner,
        *,
        stream_every: int = 1,
        emit_hidden: bool = False,
        max_batch: int = 32,
        start_on: Literal["request", "stream"] = "request",
        default_sampling: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if stream_every < 1:
            raise ValueError(f"stream_every must be >= 1, got {stream_every}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if start_on not in ("request", "stream"):
            raise ValueError(f"start_on must be 'request' or 'stream', got {start_on!r}")
        self.runner = runner
        self.stream_every = stream_every
        self.emit_hidden = emit_hidden
        self.max_batch = max_batch
        self.start_on = start_on
        self.default_sampling = SamplingParams.from_mapping(None, defaults=default_sampling, where="default_sampling")
        self._default_sampling_raw = dict(default_sampling or {})
        self._stream_fed = isinstance(runner, StreamFedRunner)
        self._fed_runner: StreamFedRunner | None = runner if isinstance(runner, StreamFedRunner) else None
        self._stop_ids = set(runner.stop_token_ids())
        # Shared between the loop and the worker, guarded by `_wake`'s lock.
        self._wake = threading.Condition()
        self._commands: deque[tuple[str, str, Any]] = deque()  # (kind, request_id, payload), in arrival order
        self._active: set[str] = set()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._queued_count = 0
        self._stopping = False
        self._crashed: str | None = None
        # Owned by the worker thread.
        self._outgoing: list[OutgoingMessage] = []  # emitted during the current phase, handed over at once
        self._waiting: OrderedDict[str, ArRequest] = OrderedDict()
        self._running: OrderedDict[str, ArRequest] = OrderedDict()
        self._thread: threading.Thread | None = None

    # --- event-loop side -------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        self._thread = threading.Thread(target=self._work, name=f"{self.stage_name or 'ar'}-worker", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        await super().stop()
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            thread, self._thread = self._thread, None
            await asyncio.to_thread(thread.join)

    async def run(self) -> None:
        while True:
            message = await self.inbox.get()
            self._accept(message)

    def _accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        with self._wake:
            active = rid in self._active
            finished = rid in self._finished
            crashed = self._crashed
        if crashed is not None:
            if not active and not finished:  # the held requests were failed by the crash itself
                with self._wake:
                    self._remember_finished(rid)
                self._fail_now(rid, crashed)
            return
        if message.kind is IncomingKind.NEW_REQUEST:
            if active and self.start_on == "stream" and self._stream_fed:
                self._send("feed", rid, (message.data, True))
            elif active:
                self._fail_now(rid, "a request with this id is already running here")
            elif not finished:
                self._create(message, inputs=message.data)
        elif self._stream_fed and not finished:
            if not active and message.kind is IncomingKind.STREAM_CHUNK and self.start_on == "stream":
                self._create(message, inputs={})
                active = rid in self._active
            if active:
                done = message.kind is IncomingKind.STREAM_DONE
                self._send("feed", rid, (None if done else message.data, done))

    def _create(self, message: IncomingMessage, inputs: Any) -> None:
        try:
            params = SamplingParams.from_mapping(message.params.get("sampling"), defaults=self._default_sampling_raw)
        except InvalidRequest as exc:
            self._refuse(message.request_id, str(exc))
            return
        if not isinstance(inputs, Mapping):
            self._refuse(message.request_id, f"expected a dict as input, got {type(inputs).__name__}")
            return
        with self._wake:
            self._active.add(message.request_id)
            self._queued_count += 1
        self._send("new", message.request_id, ArRequest(message.request_id, inputs, params))

    def _refuse(self, request_id: str, reason: str) -> None:
        """Fail a request that never started; in stream mode its next chunks are then ignored."""
        if self.start_on == "stream":
            with self._wake:
                self._remember_finished(request_id)
        self._fail_now(request_id, reason)

    def _fail_now(self, request_id: str, reason: str) -> None:
        self.emit(OutgoingMessage(OutgoingKind.ERROR, request_id, error=f"stage {self.stage_name}: {reason}"))

    def _send(self, kind: str, request_id: str, payload: Any) -> None:
        with self._wake:
            self._commands.append((kind, request_id, payload))
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        if self.start_on == "stream":
            # Chunks already in flight must not start the aborted request again.
            with self._wake:
                self._remember_finished(request_id)
        self._send("abort", request_id, None)

    def load(self) -> SchedulerLoad:
        with self._wake:
            queued = self._queued_count
        return SchedulerLoad(queued=queued, running=len(self._running), kv_slots=self.runner.kv_slots())

    # --- worker thread ---------------------------------------------------------------

    def emit(self, message: OutgoingMessage) -> None:
        # From the worker, messages are handed to the loop in one call per phase: one
        # wake-up of the loop per decode step instead of one per request.
        if self._thread is not None and threading.current_thread() is self._thread:
            self._outgoing.append(message)
        else:
            super().emit(message)

    def _flush(self) -> None:
        if self._outgoing and self._loop is not None:
            messages, self._outgoing = self._outgoing, []
            self._loop.call_soon_threadsafe(self._put_all, messages)

    def _put_all(self, messages: list[OutgoingMessage]) -> None:
        for message in messages:
            self.outbox.put_nowait(message)

    def _work(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            # A bug outside any one request's compute: fail everything held, refuse new work.
            reason = f"worker crashed: {type(exc).__name__}: {exc}"
            with self._wake:
                self._crashed = reason
                held = list(self._active)
            for rid in held:
                self._fail_now(rid, reason)
            self._flush()
            raise

    def _serve(self) -> None:
        while True:
            idle = not self._admissible() and not self._decodable()
            with self._wake:
                while idle and not self._commands and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for kind, rid, payload in commands:
                self._apply(kind, rid, payload)
            self._admit()
            batch = self._decodable()
            if batch:
                self._step(batch)
            self._flush()  # everything emitted this round (tokens, failures) leaves before the next wait
        for rid in [*self._waiting, *self._running]:
            self.runner.release(rid)

    def _apply(self, kind: str, rid: str, payload: Any) -> None:
        if kind == "new":
            self._waiting[rid] = payload
        elif kind == "feed":
            if rid in self._waiting or rid in self._running:
                data, done = payload
                fed_runner = self._fed_runner
                if fed_runner is not None:
                    self._guarded([rid], "reading its input stream", lambda: fed_runner.feed(rid, data, done=done))
        elif kind == "abort":
            self._drop(rid)

    def _ready(self, rid: str) -> bool:
        return self._fed_runner is None or self._fed_runner.ready(rid)

    def _admissible(self) -> list[str]:
        room = self.max_batch - len(self._running)
        return [rid for rid in self._waiting if self._ready(rid)][: max(room, 0)]

    def _decodable(self) -> list[ArRequest]:
        return [request for rid, request in self._running.items() if self._ready(rid)]

    def _admit(self) -> None:
        for rid in self._admissible():
            request = self._waiting.pop(rid)
            self._count_dequeued()
            self.profile(EventKind.PREFILL_START, rid)
            output = self._guarded([rid], "prefill", lambda: self.runner.prefill(rid, request.inputs))
            if output is None:
                self._flush()
                continue
            self.profile(EventKind.PREFILL_END, rid, prompt_tokens=output.prompt_tokens)
            request.prompt_tokens = output.prompt_tokens or 0
            self._running[rid] = request
            self._guarded([rid], "sampling/streaming", partial(self._advance, request, output, 0.0))
            self._flush()  # each first token leaves as soon as it exists

    def _step(self, batch: list[ArRequest]) -> None:
        ids = [request.request_id for request in batch]
        tokens = [request.last_token for request in batch]
        started = time.perf_counter()
        outputs = self._guarded(ids, "decode", lambda: self.runner.decode(ids, tokens))
        if outputs is None:
            return
        seconds = time.perf_counter() - started
        for request, output in zip(batch, outputs):
            request.decode_steps += 1
            self._guarded([request.request_id], "sampling/streaming", partial(self._advance, request, output, seconds))

    def _advance(self, request: ArRequest, output: Any, seconds: float) -> None:
        request.decode_seconds += seconds
        request.take(output, self.runner, self._stop_ids)
        if request.finish_reason is None and request.steps_since_emit < self.stream_every:
            return
        chunk = request.chunk(self.runner, self.emit_hidden)
        if chunk is not None:
            self._emit_first(request)
            self.emit(OutgoingMessage(OutgoingKind.STREAM, request.request_id, chunk))
        if request.finish_reason is not None:
            rid = request.request_id
            self.profile(EventKind.DECODE_STEPS, rid, steps=request.decode_steps, seconds=request.decode_seconds)
            del self._running[rid]
            self.runner.release(rid)
            self._forget(rid)
            self._emit_first(request)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, request.result(self.runner, self.emit_hidden)))

    def _emit_first(self, request: ArRequest) -> None:
        if not request.emitted:
            request.emitted = True
            self.profile(EventKind.FIRST_EMIT, request.request_id)

    def _guarded(self, request_ids: list[str], what: str, call: Any) -> Any:
        """Run ``call``; if the model raises, those requests fail (with the cause) and leave."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - a model error fails its requests, not the stage
            for rid in request_ids:
                self._drop(rid)
                self._fail_now(rid, f"{what} failed: {type(exc).__name__}: {exc}")
            return None

    def _drop(self, rid: str) -> None:
        """Forget ``rid`` wherever it is and free its KV cache."""
        if self._waiting.pop(rid, None) is not None:
            self._count_dequeued()
        self._running.pop(rid, None)
        self.runner.release(rid)
        self._forget(rid)

    def _count_dequeued(self) -> None:
        with self._wake:
            self._queued_count -= 1

    def _forget(self, rid: str) -> None:
        with self._wake:
            if rid in self._active:
                self._active.discard(rid)
                if self.start_on == "stream":
                    self._remember_finished(rid)

    def _remember_finished(self, rid: str) -> None:
        self._finished[rid] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

