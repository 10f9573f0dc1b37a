"""Continuous-batching autoregressive scheduler (thinker, talker, any causal LM).

All model compute runs in one worker thread so the event loop stays free for IO. The
worker loops: apply what the loop sent (new requests, stream increments, aborts),
prefill newly admitted requests, then advance every running request by one token in a
single batched decode step. Prefill is chunked when the runner can
(:class:`~omnictl.schedulers.runner.ChunkedPrefillRunner`): each round prefills at most
``prefill_chunk`` prompt tokens (default 512), so a long prompt (thousands of tokens)
takes many rounds, and between two of its chunks aborts are applied and the other
requests take their decode step: it delays them by one chunk's compute, not by the
whole prompt's, and its own abort takes effect within a chunk. A request joins the
batch between two steps and leaves it when it finishes; its KV cache is released on
finish and on abort.

Outputs, per request (types from :mod:`omnictl.outputs`, so an autoregressive stage can
be a ``text`` terminal as it is):

- ``stream`` every ``stream_every`` tokens: a :class:`~omnictl.outputs.TokenDelta` (the new
  ``token_ids`` and their ``text``), with ``hidden`` (``[n, H]``) when ``emit_hidden``;
  ``hidden[i]`` is the state that produced ``token_ids[i]`` (for the first token, the
  prompt's last position);
- ``result``: a :class:`~omnictl.outputs.TokenResult` (``text``, ``token_ids``,
  ``prompt_tokens``, ``completion_tokens``, ``finish_reason`` STOP or LENGTH; every
  ``hidden`` row when ``emit_hidden``). A stop token ends the request but is not in
  ``token_ids`` (it counts in ``completion_tokens``); a stop string is cut from ``text``
  and never streamed.

Upstream streams (a talker fed by the thinker's hidden states): when the runner also
implements :class:`StreamFedRunner`, ``stream_chunk`` / ``stream_done`` data is passed
to ``runner.feed`` and a request only prefills or decodes while ``runner.ready`` says
so. With ``start_on="stream"`` the first chunk starts the request, and the
``new_request`` (the upstream's final result) is fed as the last increment; when it
comes first (the upstream streamed nothing) it also starts the request. Runners
without ``feed`` ignore stream messages and start from ``new_request`` alone.

Hooks: a model scheduler extends this one by overriding these public methods, never
the private ones (all default to doing nothing special):

- :meth:`~AutoregressiveScheduler.request_sampling` ``(params) -> Mapping | None``
  (event loop): which sampling fields of a request apply at this stage; they are laid
  over ``default_sampling`` and validated, a bad value fails the request.
- :meth:`~AutoregressiveScheduler.on_start` ``(request_id, sampling) -> None`` (worker
  thread): a request was accepted, before anything is fed to it or it prefills.
- :meth:`~AutoregressiveScheduler.on_output` ``(request_id, data, *, final) -> data``
  (worker thread): a stream chunk or the result just before it leaves; returns what
  leaves (e.g. with per-request extras the runner produced). Raising fails the request.
- :meth:`~AutoregressiveScheduler.on_drop` ``(request_id) -> None`` (worker thread):
  the request left without a result (aborted, or a model call or hook failed); free
  what is kept for it beyond the KV cache the runner already released.

Playback deadlines (``audio_policy="deadline"``, for a stage whose tokens become audio
downstream: a talker's codec frames, a TTS's text): ``max_batch`` is then the width of a
round, and when more requests are ready than fit, the slots go to the streams nearest
starvation by :meth:`~omnictl.playback.policy.PlaybackDeadlines.choose`. A request's slack
counts ``audio_s_per_token`` seconds of audio per token it has emitted; one that has
emitted nothing is due its ``ttfp_target_s`` after it arrived. A running stream far ahead
of its listener gives its slot up (it is *parked*: it keeps its KV cache and takes no
decode step) to a new one whose first chunk is due sooner, and gets it back when its own
slack is the smaller; at most ``max_batch`` are parked. Under ``fifo`` (the default)
requests keep their slot until they finish, in arrival order, as before.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.messages import RESUME_PARAM
from omnictl.outputs import TokenDelta, TokenResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S, PlaybackDeadlines, check_policy
from omnictl.profiling.events import EventKind
from omnictl.recent import RecentIds
from omnictl.schedulers.ar_request import ArRequest
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from omnictl.schedulers.runner import AutoregressiveRunner, ChunkedPrefillRunner, StreamFedRunner
from omnictl.schedulers.sampling import HF_ENGINE, HF_FIELDS, SamplingParams

__all__ = ["AutoregressiveScheduler", "StartOn", "StreamFedRunner"]


class StartOn(str, enum.Enum):
    """What starts a request at this stage (a str enum: ``"request"`` / ``"stream"`` are accepted)."""

    REQUEST = "request"  # its new_request (the upstream's result, or the entry input)
    STREAM = "stream"  # its first stream chunk; the new_request is then its last increment


# Commands from the event loop to the worker thread, applied in arrival order.


@dataclass(frozen=True, slots=True)
class _NewRequest:
    request: ArRequest


@dataclass(frozen=True, slots=True)
class _Feed:
    request_id: str
    data: Any  # an upstream increment (None with `done` for a bare stream-done)
    done: bool


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


_Command = _NewRequest | _Feed | _Abort


class AutoregressiveScheduler(Scheduler):
    def __init__(
        self,
        runner: AutoregressiveRunner,
        *,
        stream_every: int = 1,
        emit_hidden: bool = False,
        max_batch: int = 32,
        start_on: StartOn | Literal["request", "stream"] = StartOn.REQUEST,
        default_sampling: Mapping[str, Any] | None = None,
        prefill_chunk: int = 512,
        audio_policy: str = DEFAULT_POLICY,
        audio_s_per_token: float | None = None,
        ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
    ) -> None:
        """
        default_sampling: sampling fields for requests that do not set them (validated
            here: a bad value fails construction, not every request).
        prefill_chunk: prompt tokens prefilled per round (for runners that chunk): the
            most another request's next token, or an abort, waits behind a long prompt
            is one such chunk's compute (a twelfth of a 6,000-token prompt at 512).
        audio_policy: ``fifo`` or ``deadline`` (see the module docstring); ``deadline``
            needs ``audio_s_per_token``, the seconds of audio one token becomes downstream.
        """
        super().__init__()
        if stream_every < 1:
            raise ValueError(f"stream_every must be >= 1, got {stream_every}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        check_policy(audio_policy)
        self._deadlines: PlaybackDeadlines | None = None
        if audio_policy == "deadline":
            if audio_s_per_token is None or audio_s_per_token <= 0:
                raise ValueError(
                    f"audio_policy 'deadline' needs audio_s_per_token > 0 (the seconds of audio one token "
                    f"becomes), got {audio_s_per_token!r}"
                )
            self._deadlines = PlaybackDeadlines(audio_policy, ttfp_target_s)
        self.audio_s_per_token = audio_s_per_token or 0.0
        self._chunked: ChunkedPrefillRunner | None = runner if isinstance(runner, ChunkedPrefillRunner) else None
        try:
            self.start_on = StartOn(start_on)
        except ValueError:
            raise ValueError(f"start_on must be 'request' or 'stream', got {start_on!r}") from None
        self.runner = runner
        self.stream_every = stream_every
        self.emit_hidden = emit_hidden
        self.max_batch = max_batch
        # raises if invalid, or if it asks what this engine cannot do
        SamplingParams.from_mapping(None, defaults=default_sampling, supported=HF_FIELDS, engine=HF_ENGINE)
        self._sampling_defaults: dict[str, Any] = dict(default_sampling or {})
        self._fed_runner: StreamFedRunner | None = runner if isinstance(runner, StreamFedRunner) else None
        # Stream mode with a runner that takes increments: the upstream's result is one too.
        self._result_is_fed = self._fed_runner is not None and self.start_on is StartOn.STREAM
        self._stop_ids = set(runner.stop_token_ids())
        # Shared between the loop and the worker, guarded by `_wake`'s lock.
        self._wake = threading.Condition()
        self._commands: deque[_Command] = deque()  # in arrival order
        self._active: set[str] = set()
        # Stream mode only: finished, refused or aborted ids, so that chunks still in
        # flight for them do not start them again.
        self._finished = RecentIds()
        self._queued_count = 0
        self._stopping = False
        self._crashed: str | None = None
        # Owned by the worker thread.
        self._outgoing: list[OutgoingMessage] = []  # emitted during the current phase, handed over at once
        self._waiting: OrderedDict[str, ArRequest] = OrderedDict()
        self._prefilling: OrderedDict[str, ArRequest] = OrderedDict()  # admitted, prompt part-way in
        self._running: OrderedDict[str, ArRequest] = OrderedDict()
        # deadline policy only: running requests sitting out rounds, KV cache kept
        self._parked: OrderedDict[str, ArRequest] = OrderedDict()
        self._thread: threading.Thread | None = None

    # --- hooks for model schedulers (see the module docstring) ----------------------

    def request_sampling(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Hook (event loop): the sampling fields a request with these ``params`` sets here.

        They are laid over ``default_sampling`` and validated; an invalid one fails the
        request with a message naming the field. Default: the request's ``sampling``.
        """
        sampling: Mapping[str, Any] | None = params.get("sampling")
        return sampling

    def on_start(self, request_id: str, sampling: SamplingParams) -> None:
        """Hook (worker thread): the request was accepted with these resolved ``sampling``
        parameters; it runs before anything is fed to the runner for it and before its
        prefill. The request leaves later through a result or :meth:`on_drop`."""

    def on_output(self, request_id: str, data: TokenDelta | TokenResult, *, final: bool) -> Any:
        """Hook (worker thread): a stream chunk (``final=False``, a :class:`TokenDelta`) or
        the result (``final=True``, a :class:`TokenResult`) of ``request_id`` just before
        it is emitted; returns what is emitted (e.g. a subclass carrying model extras).

        Chunks come in order and the result last, after the runner released the
        request's KV cache. Raising fails the request (then :meth:`on_drop` follows).
        """
        return data

    def on_drop(self, request_id: str) -> None:
        """Hook (worker thread): the request left without a result (aborted, or a model
        call or a hook failed), after the runner released its KV cache. Free what is
        kept for it besides. It may come for ids never started, or twice; it must not
        raise (that is a bug outside any one request: the worker stops, failing all)."""

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
            self._accept(await self.inbox.get())  # no local: an idle loop keeps no input alive

    def _accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        with self._wake:
            active = rid in self._active
            finished = rid in self._finished
            crashed = self._crashed
        if crashed is not None:
            if not active and not finished:  # the held requests were failed by the crash itself
                with self._wake:
                    self._finished.add(rid)
                self._fail_now(rid, crashed)
            return
        if message.kind is IncomingKind.NEW_REQUEST:
            if active and self._result_is_fed:
                self._send(_Feed(rid, message.data, done=True))
            elif active:
                self._fail_now(rid, "a request with this id is already running here")
            elif self._result_is_fed:
                # Nothing was streamed (the upstream stopped at once): its result, a typed
                # output and not the dict a request starts from, is the whole input, fed
                # as a stream's would be.
                if not finished and self._create(message, inputs={}):
                    self._send(_Feed(rid, message.data, done=True))
            elif not finished:
                self._create(message, inputs=message.data)
        elif self._fed_runner is not None and not finished:
            if not active and message.kind is IncomingKind.STREAM_CHUNK and self.start_on is StartOn.STREAM:
                active = self._create(message, inputs={})
            if active:
                done = message.kind is IncomingKind.STREAM_DONE
                self._send(_Feed(rid, None if done else message.data, done=done))

    def _create(self, message: IncomingMessage, inputs: Any) -> bool:
        """Queue a new request for the worker; False if it was refused (and failed)."""
        try:
            params = SamplingParams.from_mapping(
                self.request_sampling(message.params),
                defaults=self._sampling_defaults,
                supported=HF_FIELDS,
                engine=HF_ENGINE,
            )
        except InvalidRequest as exc:
            self._refuse(message.request_id, str(exc), exc.field)
            return False
        if not isinstance(inputs, Mapping):
            self._refuse(message.request_id, f"expected a dict as input, got {type(inputs).__name__}")
            return False
        # A resumed request (a replica died while it streamed, see the coordinator's core):
        # the tokens its caller already has, by stage.
        resume = message.params.get(RESUME_PARAM)
        forced = resume.get(self.stage_name, ()) if isinstance(resume, Mapping) and self.stage_name else ()
        if not (isinstance(forced, (list, tuple)) and all(isinstance(t, int) for t in forced)):
            self._refuse(message.request_id, f"{RESUME_PARAM!r} must map stage names to lists of token ids")
            return False
        with self._wake:
            self._active.add(message.request_id)
            self._queued_count += 1
        self._send(_NewRequest(ArRequest(message.request_id, inputs, params, forced)))
        return True

    def _refuse(self, request_id: str, reason: str, field: str | None = None) -> None:
        """Fail a request that never started; in stream mode its next chunks are then ignored."""
        if self.start_on is StartOn.STREAM:
            with self._wake:
                self._finished.add(request_id)
        self._fail_now(request_id, reason, field)

    def _fail_now(
        self, request_id: str, reason: str, field: str | None = None, exc: BaseException | None = None
    ) -> None:
        self.emit(
            OutgoingMessage(
                OutgoingKind.ERROR, request_id, error=f"stage {self.stage_name}: {reason}", field=field, exc=exc
            )
        )

    def _send(self, command: _Command) -> None:
        with self._wake:
            self._commands.append(command)
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        if self.start_on is StartOn.STREAM:
            # Chunks already in flight must not start the aborted request again.
            with self._wake:
                self._finished.add(request_id)
        self._send(_Abort(request_id))

    def load(self) -> SchedulerLoad:
        with self._wake:
            queued = self._queued_count
        running = len(self._running) + len(self._prefilling) + len(self._parked)
        return SchedulerLoad(queued=queued, running=running, kv_slots=self.runner.kv_slots())

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
            self._put(message)

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
            idle = not self._admissible() and not self._decodable() and not self._prefilling and not self._resumable()
            with self._wake:
                while idle and not self._commands and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            # One round, in calls of their own: idle, this frame must not keep the last
            # requests' inputs alive in a local (their tensors may be views of another
            # process's shared-memory slot, lent until they are freed).
            self._apply_all(commands)
            del commands
            self._admit()
            self._step_decodable()
            self._flush()  # everything emitted this round (tokens, failures) leaves before the next wait
        for rid in [*self._waiting, *self._prefilling, *self._running, *self._parked]:
            self.runner.release(rid)

    def _apply_all(self, commands: list[_Command]) -> None:
        for command in commands:
            self._apply(command)

    def _step_decodable(self) -> None:
        batch = self._decodable()
        if batch:
            self._step(batch)

    def _apply(self, command: _Command) -> None:
        match command:
            case _NewRequest(request=request):
                rid = request.request_id
                self._waiting[rid] = request
                if self._deadlines is not None:
                    self._deadlines.arrived(rid, time.monotonic())
                self._guarded([rid], "starting", lambda: self.on_start(rid, request.params))
            case _Feed(request_id=rid, data=data, done=done):
                fed_runner = self._fed_runner
                if fed_runner is not None and (rid in self._waiting or rid in self._running or rid in self._parked):
                    self._guarded([rid], "reading its input stream", lambda: fed_runner.feed(rid, data, done=done))
            case _Abort(request_id=rid):
                self._drop(rid)

    def _ready(self, rid: str) -> bool:
        return self._fed_runner is None or self._fed_runner.ready(rid)

    def _admissible(self) -> list[str]:
        room = self.max_batch - len(self._running) - len(self._prefilling)
        return [rid for rid in self._waiting if self._ready(rid)][: max(room, 0)]

    def _decodable(self) -> list[ArRequest]:
        return [request for rid, request in self._running.items() if self._ready(rid)]

    def _resumable(self) -> bool:
        """A parked request is ready and a slot is free for it."""
        room = self.max_batch - len(self._running) - len(self._prefilling)
        return room > 0 and any(self._ready(rid) for rid in self._parked)

    def _by_deadline(self) -> None:
        """Deadline policy: this round's slots to the streams nearest starvation. A running
        request left out is parked; a parked one chosen runs again; the waiting ones chosen
        move to the front of the queue, which :meth:`_admissible` takes as room allows."""
        assert self._deadlines is not None
        parked = [rid for rid in self._parked if self._ready(rid)]
        waiting = [rid for rid in self._waiting if self._ready(rid)]
        if not parked and not waiting:
            return
        chosen = self._deadlines.choose(
            list(self._running),
            parked + waiting,
            self.max_batch - len(self._prefilling),
            time.monotonic(),
            may_leave=self.max_batch - len(self._parked),
        )
        picked = set(chosen)
        for rid in [rid for rid in self._running if rid not in picked]:
            self._parked[rid] = self._running.pop(rid)
        for rid in chosen:
            if rid in self._parked:
                self._running[rid] = self._parked.pop(rid)
        for rid in reversed([rid for rid in chosen if rid in self._waiting]):
            self._waiting.move_to_end(rid, last=False)

    def _admit(self) -> None:
        if self._deadlines is not None:
            self._by_deadline()
        for rid in self._admissible():
            self._prefilling[rid] = self._waiting.pop(rid)
            self._count_dequeued()
            self.profile(EventKind.PREFILL_START, rid)
        budget = self.prefill_chunk  # prompt tokens this round, over every request prefilling
        for rid, request in list(self._prefilling.items()):
            if budget <= 0:
                break  # the rest continue next round, after a decode step
            step = self._guarded([rid], "prefill", partial(self._prefill_part, rid, request, budget))
            if step is None:  # failed: dropped, its error emitted
                self._flush()
                continue
            used, output = step
            budget -= used
            if output is None:
                self._prefilling.move_to_end(rid)  # round robin: a long prompt does not starve a short one
                continue
            del self._prefilling[rid]
            self.profile(EventKind.PREFILL_END, rid, prompt_tokens=output.prompt_tokens)
            request.prompt_tokens = output.prompt_tokens or 0
            self._running[rid] = request
            self._guarded([rid], "sampling/streaming", partial(self._advance, request, output, 0.0))
            self._flush()  # each first token leaves as soon as it exists

    def _prefill_part(self, rid: str, request: ArRequest, budget: int) -> tuple[int, Any]:
        """(prompt tokens done, the first output once the prompt is in, else None)."""
        if self._chunked is None:
            return 0, self.runner.prefill(rid, request.inputs)  # whole, as before: no budget to spend
        return self._chunked.prefill_chunk(rid, request.inputs, budget)

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
        rid = request.request_id
        chunk = request.chunk(self.runner, self.emit_hidden)
        if chunk is not None:
            data = self.on_output(rid, chunk, final=False)
            if self._deadlines is not None:
                self._deadlines.sent(rid, len(chunk.token_ids) * self.audio_s_per_token, time.monotonic())
            self._emit_first(request)
            self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, data))
        if request.finish_reason is not None:
            self.profile(EventKind.DECODE_STEPS, rid, steps=request.decode_steps, seconds=request.decode_seconds)
            del self._running[rid]
            self.runner.release(rid)
            self._forget(rid)
            if self._deadlines is not None:
                self._deadlines.finished(rid)
            result = self.on_output(rid, request.result(self.runner, self.emit_hidden), final=True)
            self._emit_first(request)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def _emit_first(self, request: ArRequest) -> None:
        if not request.emitted:
            request.emitted = True
            self.profile(EventKind.FIRST_EMIT, request.request_id)

    def _guarded(self, request_ids: list[str], what: str, call: Any) -> Any:
        """Run ``call``; if the model (or a hook) raises, those requests fail (with the cause) and leave."""
        try:
            with self.busy():  # /health shows a step that runs long
                return call()
        except Exception as exc:
            field = exc.field if isinstance(exc, InvalidRequest) else None  # the input's fault: a 400
            for rid in request_ids:
                self._drop(rid)
                self._fail_now(rid, f"{what} failed: {type(exc).__name__}: {exc}", field, exc)
            return None

    def _drop(self, rid: str) -> None:
        """Forget ``rid`` wherever it is, free its KV cache, then let the subclass free its own."""
        if self._waiting.pop(rid, None) is not None:
            self._count_dequeued()
        self._prefilling.pop(rid, None)
        self._running.pop(rid, None)
        self._parked.pop(rid, None)
        if self._deadlines is not None:
            self._deadlines.finished(rid)
        self.runner.release(rid)
        self._forget(rid)
        self.on_drop(rid)

    def _count_dequeued(self) -> None:
        with self._wake:
            self._queued_count -= 1

    def _forget(self, rid: str) -> None:
        with self._wake:
            if rid in self._active:
                self._active.discard(rid)
                if self.start_on is StartOn.STREAM:
                    self._finished.add(rid)
