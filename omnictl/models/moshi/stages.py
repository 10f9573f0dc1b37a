"""Stage factories for Moshi (``topologies/moshi.yaml``): the temporal and depth transformers and the text terminal.

A Moshi session is one request whose input never stops until the caller ends it: the
user's audio streams into the Mimi encoder (:func:`omnictl.models.mimi.stages.stream_encoder`,
the entry), which streams a frame of codes every 80 ms to the temporal transformer; each
user frame lets the temporal transformer take one step (:mod:`omnictl.models.moshi.model`)
and stream its text token and hidden state to the depth transformer, which makes the
position's audio codes. Those codes go two ways: back to the temporal transformer, whose
next step reads them (a topology is acyclic: the way back is a process-local hand-over,
:func:`hand_back`, so both stages share a ``process:``), and on, as Moshi's finished
frame, to the Mimi decoder (:func:`omnictl.models.mimi.stages.stream_decoder`, the audio
terminal) and to the text terminal (:func:`text`). No turns: one frame in, one frame out,
for as long as the session lasts.

Sampling is the request's (``sampling``) over kyutai's defaults (text: temperature 0.7,
top-k 25; audio: 0.8, top-k 250); temperature 0 is greedy, as ``do_sample=False`` is.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from omnictl.models.mimi.session import SessionScheduler
from omnictl.models.moshi.model import Depth, Session, Step, Temporal
from omnictl.outputs import TextDelta, TextResult
from omnictl.schedulers.base import IncomingKind, IncomingMessage, Scheduler
from omnictl.schedulers.sampling import HF_ENGINE, HF_FIELDS, Sampler, SamplingParams
from omnictl.schedulers.streaming import FinishOn, StreamingScheduler, Window

TEXT_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_k": 25}
AUDIO_SAMPLING: dict[str, Any] = {"temperature": 0.8, "top_k": 250}

# --- the way back: depth -> temporal, inside one process ------------------------------

_lock = threading.Lock()
_temporals: dict[str, tuple[Scheduler, asyncio.AbstractEventLoop]] = {}


def _register(stage: str, scheduler: Scheduler, loop: asyncio.AbstractEventLoop) -> None:
    with _lock:
        _temporals[stage] = (scheduler, loop)


def _unregister(stage: str, scheduler: Scheduler) -> None:
    with _lock:
        if _temporals.get(stage, (None,))[0] is scheduler:
            del _temporals[stage]


def hand_back(stage: str, request_id: str, data: Any, *, source: str | None) -> None:
    """Give a position's audio codes to the temporal ``stage`` of this process (any thread), as a
    stream chunk of its inbox from ``source``, exactly as a ``stream_to`` edge would deliver it."""
    with _lock:
        found = _temporals.get(stage)
    if found is None:
        raise RuntimeError(
            f"no Moshi temporal stage {stage!r} runs in this process: the depth stage must share the temporal "
            "stage's `process:` in the topology (it hands every position's codes back to it)"
        )
    scheduler, loop = found
    message = IncomingMessage(IncomingKind.STREAM_CHUNK, request_id, data=data, source=source)
    loop.call_soon_threadsafe(scheduler.inbox.put_nowait, message)


def _sampler(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> Sampler:
    return Sampler(
        SamplingParams.from_mapping(params.get("sampling"), defaults=defaults, supported=HF_FIELDS, engine=HF_ENGINE)
    )


# --- the temporal transformer ---------------------------------------------------------


@dataclass(slots=True)
class _Temporal:
    session: Session
    sampler: Sampler
    user: deque[torch.Tensor] = field(default_factory=deque)  # user frames not yet stepped
    waiting: bool = False  # a position is out at the depth stage: no step until its codes are back
    moshi: torch.Tensor | None = None  # the codes the next step reads
    ended: bool = False  # the user's input has ended


class TemporalScheduler(SessionScheduler):
    """Steps a session once per user frame, once the depth stage has handed back the last position's codes."""

    worker_name = "temporal"

    def __init__(self, temporal: Temporal, *, depth: str, sampling: Mapping[str, Any]) -> None:
        super().__init__()
        self.temporal = temporal
        self.depth = depth
        self.sampling = dict(sampling)

    async def start(self) -> None:
        await super().start()
        _register(self.stage_name or "temporal", self, asyncio.get_running_loop())

    async def stop(self) -> None:
        _unregister(self.stage_name or "temporal", self)
        await super().stop()

    def open(self, request_id: str, params: Mapping[str, Any]) -> _Temporal:
        return _Temporal(session=self.temporal.open(), sampler=_sampler(params, self.sampling))

    def handle(self, request_id: str, state: _Temporal, message: IncomingMessage) -> None:
        if message.kind is IncomingKind.STREAM_CHUNK and message.source == self.depth:
            position, codes = message.data["position"], message.data["codes"]
            if not state.waiting or position != state.session.position:
                raise RuntimeError(f"Moshi: codes came back for position {position}, expected {state.session.position}")
            state.moshi, state.waiting = codes, False
        elif message.kind is IncomingKind.STREAM_CHUNK:
            frames = torch.as_tensor(message.data["codes"], dtype=torch.long)
            state.user.extend(frames.reshape(-1, self.temporal.codebooks))
        elif message.kind is IncomingKind.NEW_REQUEST:
            state.ended = True  # the encoder's result: the user's input has ended
        self._advance(request_id, state)

    def _advance(self, request_id: str, state: _Temporal) -> None:
        session = state.session
        if state.waiting:
            return
        if session.position == 0:
            self._send(request_id, state, self.temporal.step(session, state.sampler, None, None))
        elif state.user:
            step = self.temporal.step(session, state.sampler, state.moshi, state.user.popleft())
            self._send(request_id, state, step)
        elif state.ended:
            # Every user frame was stepped and its Moshi frame made: the session is over.
            self.finish(request_id, {"text_tokens": list(session.tokens), "positions": session.position})

    def _send(self, request_id: str, state: _Temporal, step: Step) -> None:
        state.waiting, state.moshi = True, None
        self.stream(request_id, {"position": step.position, "token": step.token, "hidden": step.hidden})


def temporal(
    model_path: str | Path | None = None,
    device: str | None = None,
    depth: str = "depth",
    temperature: float = TEXT_SAMPLING["temperature"],
    top_k: int = TEXT_SAMPLING["top_k"],
) -> TemporalScheduler:
    """``depth``: the name of the depth stage (in this stage's process) that hands each position's codes back."""
    sampling = {"temperature": temperature, "top_k": top_k}
    return TemporalScheduler(Temporal(model_path, device), depth=depth, sampling=sampling)


# --- the depth transformer ------------------------------------------------------------


@dataclass(slots=True)
class _Depth:
    sampler: Sampler
    text: _Detokenizer
    previous: torch.Tensor | None = None  # the last position's codes: its codebook 0 starts the next frame
    previous_token: int | None = None
    frames: list[torch.Tensor] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


class _Detokenizer:
    """Text pieces of a token stream as they become whole (a byte-level BPE splits characters)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids before this are out and no longer needed for context
        self.read = 0  # ids before this have been turned into text

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # a character still incomplete, or a token that says nothing (Moshi's padding)
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


class DepthScheduler(SessionScheduler):
    """Makes each position's audio codes; hands them back to the temporal stage and streams whole frames on."""

    worker_name = "depth"

    def __init__(self, depth: Depth, *, temporal: str, sampling: Mapping[str, Any], tokenizer: Any) -> None:
        super().__init__()
        self.model = depth
        self.temporal = temporal
        self.sampling = dict(sampling)
        self.tokenizer = tokenizer

    def open(self, request_id: str, params: Mapping[str, Any]) -> _Depth:
        return _Depth(sampler=_sampler(params, self.sampling), text=_Detokenizer(self.tokenizer))

    def handle(self, request_id: str, state: _Depth, message: IncomingMessage) -> None:
        if message.kind is IncomingKind.STREAM_CHUNK:
            data = message.data
            step = Step(position=int(data["position"]), token=int(data["token"]), hidden=data["hidden"])
            codes = self.model.codes(step, state.sampler)
            hand_back(self.temporal, request_id, {"position": step.position, "codes": codes}, source=self.stage_name)
            if state.previous is not None and state.previous_token is not None:
                # Moshi's frame: codebook 0 from the last position, the delayed codebooks from this one.
                frame = torch.cat([state.previous[:1], codes[1:]])
                token = state.previous_token
                state.frames.append(frame)
                state.tokens.append(token)
                piece = state.text.push(token)
                self.stream(request_id, {"codes": frame.reshape(1, -1), "token": token, "text": piece})
            state.previous, state.previous_token = codes, step.token
        elif message.kind is IncomingKind.NEW_REQUEST:  # the temporal stage's result: the session is over
            codes = (
                torch.stack(state.frames) if state.frames else torch.zeros(0, self.model.codebooks, dtype=torch.long)
            )
            text = self.tokenizer.decode(state.tokens, skip_special_tokens=True)
            # The last position made starts a frame the session ended before finishing: its
            # text token and codes (codebook 0 is that frame's; 1.. finish the last frame sent).
            in_flight = {"token": state.previous_token, "codes": state.previous}
            self.finish(
                request_id, {"codes": codes, "text_tokens": list(state.tokens), "text": text, "in_flight": in_flight}
            )


def depth(
    model_path: str | Path | None = None,
    device: str | None = None,
    temporal: str = "temporal",
    temperature: float = AUDIO_SAMPLING["temperature"],
    top_k: int = AUDIO_SAMPLING["top_k"],
) -> DepthScheduler:
    """``temporal``: the name of the temporal stage (in this stage's process) that reads each position's codes back."""
    from transformers import AutoTokenizer

    sampling = {"temperature": temperature, "top_k": top_k}
    tokenizer = AutoTokenizer.from_pretrained(str(model_path)) if model_path is not None else None
    return DepthScheduler(Depth(model_path, device), temporal=temporal, sampling=sampling, tokenizer=tokenizer)


# --- the text terminal ----------------------------------------------------------------


def _text_units(data: Any) -> str:
    return str(data["text"])


def _text_window(window: Window) -> TextDelta | None:
    return TextDelta(text=window.new) if window.new else None


def _text_result(_rid: str, _params: Mapping[str, Any], outputs: list[Any]) -> TextResult:
    return TextResult(text="".join(output.text for output in outputs))


def text() -> StreamingScheduler:
    """Moshi's words as they become whole, one :class:`~omnictl.outputs.TextDelta` per frame that
    has any (most frames carry Moshi's text padding: nothing to say); the result, all of them."""
    return StreamingScheduler(
        _text_window,  # type: ignore[arg-type]  # a TextDelta is emitted as it is, the text terminal's contract
        units=_text_units,
        split=len,
        finish=_text_result,  # type: ignore[arg-type]  # the typed TextResult a text terminal returns
        finish_on=FinishOn.REQUEST,
    )
