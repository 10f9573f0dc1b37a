"""Parrot: a toy omni model that repeats what it hears, as text and as beeps.

It has the parts a real model has, each in the place a real model puts it (see
docs/adding-a-model.md):

- ``listen``: the entry stage, a plain function. It takes the typed chat request (from
  the HTTP server, or a dict from the Python API) and builds the prompt.
- ``think``: an autoregressive language model. ``ParrotRunner`` is its model runner (the
  "weights" can only repeat the prompt, byte by byte); the stock
  ``AutoregressiveScheduler`` batches, samples and streams ``TokenDelta`` for it and
  returns a ``TokenResult``.
- ``show``: the ``text`` terminal, a scheduler written from scratch (``ShowText``): it
  passes the thinker's text on as ``TextDelta`` while it streams and ends with a
  ``TextResult``.
- ``speak``: the ``audio`` terminal, a streaming "vocoder" (the stock
  ``StreamingScheduler``): one beep per word as soon as the word is complete, as an
  ``AudioChunk``; the whole waveform as an ``AudioResult`` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from omnictl.inputs import as_chat_request
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TokenDelta, TokenResult
from omnictl.recent import RecentIds
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler, SchedulerLoad
from omnictl.schedulers.runner import StepOutput
from omnictl.schedulers.streaming import StreamingScheduler, Window

EOS = 256  # token ids 0-255 are bytes
SAMPLE_RATE = 16_000
BEEP_SECONDS_PER_CHAR = 0.02


# --- entry stage -------------------------------------------------------------------


def listen() -> Any:
    def run(inputs: Any) -> dict[str, Any]:
        request = as_chat_request(inputs)  # the typed request, whichever way it came
        message = request.last_user_message()
        words = [message.text()] if message is not None else []
        if message is not None and message.audio():
            seconds = sum(part.samples.size / part.sample_rate for part in message.audio())
            words.append(f"({seconds:.1f} seconds of audio)")
        return {"prompt": list(" ".join(w for w in words if w).encode())}

    return run


# --- the language model: a runner for the autoregressive scheduler --------------------


@dataclass
class _Cache:
    """What a real runner keeps as a KV cache: here, the prompt and the position."""

    prompt: list[int]
    position: int = 0


class ParrotRunner:
    """An ``AutoregressiveRunner`` whose next token is always the prompt's next byte."""

    def __init__(self) -> None:
        self._caches: dict[str, _Cache] = {}

    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        cache = self._caches[request_id] = _Cache(list(inputs["prompt"]))
        return StepOutput(logits=self._next(cache), prompt_tokens=len(cache.prompt))

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        return [StepOutput(logits=self._next(self._caches[rid])) for rid in request_ids]

    def _next(self, cache: _Cache) -> torch.Tensor:
        token = cache.prompt[cache.position] if cache.position < len(cache.prompt) else EOS
        cache.position += 1
        logits = torch.full((EOS + 1,), float("-inf"))
        logits[token] = 0.0  # certain at any temperature
        return logits

    def release(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {EOS}

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def kv_slots(self) -> int:
        return len(self._caches)


def think(stream_every: int = 4) -> AutoregressiveScheduler:
    return AutoregressiveScheduler(ParrotRunner(), stream_every=stream_every)


# --- the text terminal: a scheduler from scratch ---------------------------------------


class ShowText(Scheduler):
    """Streams the thinker's text as it comes; returns it whole with the token usage.

    The thinker's chunks (``stream_to``) and its result (``next``) travel separately, so
    the result may overtake the last chunks: the result's text is the truth, and what it
    holds beyond what was shown goes out as a last delta; later chunks are dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown: dict[str, str] = {}
        self._finished = RecentIds()

    async def run(self) -> None:
        while True:
            self._handle(await self.inbox.get())

    def _handle(self, message: IncomingMessage) -> None:
        rid, data = message.request_id, message.data
        if rid in self._finished or message.kind is IncomingKind.STREAM_DONE:
            return
        shown = self._shown.get(rid, "")
        if message.kind is IncomingKind.STREAM_CHUNK and isinstance(data, TokenDelta):
            self._shown[rid] = shown + data.text
            self._show(rid, data.text)
        elif message.kind is IncomingKind.NEW_REQUEST and isinstance(data, TokenResult):
            self.abort(rid)
            if data.text.startswith(shown):
                self._show(rid, data.text[len(shown) :])
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, data.plain()))  # without token ids
        else:
            self.abort(rid)
            self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"expected the thinker's tokens, got {type(data).__name__}"))

    def _show(self, rid: str, text: str) -> None:
        if text:
            self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, TextDelta(text=text)))

    def abort(self, request_id: str) -> None:
        self._shown.pop(request_id, None)
        self._finished.add(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self._shown), stream_buffers=len(self._shown))


def show() -> ShowText:
    return ShowText()


# --- the vocoder: a streaming scheduler ----------------------------------------------


def _first_word(pending: str) -> int:
    """Length of the first complete word (with its trailing space), 0 while none is."""
    end = pending.find(" ")
    return end + 1 if end >= 0 else 0


def _beep(window: Window) -> AudioChunk | None:
    word = window.new.strip()
    if not word:
        return None
    t = np.arange(int(len(word) * BEEP_SECONDS_PER_CHAR * SAMPLE_RATE)) / SAMPLE_RATE
    samples = 0.3 * np.sin(2 * np.pi * (300 + 40 * len(word)) * t)
    return AudioChunk(samples=samples.astype(np.float32), sample_rate=SAMPLE_RATE, transcript=word)


def _whole(request_id: str, params: Mapping[str, Any], chunks: list[AudioChunk]) -> AudioResult:
    samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    return AudioResult(samples=samples, sample_rate=SAMPLE_RATE, transcript=" ".join(c.transcript for c in chunks))


def _text_of(chunk: TextDelta) -> str:
    return chunk.text


def speak() -> StreamingScheduler:
    # finish_on="request": this stage is also a `next` target; the thinker's result ends the stream
    return StreamingScheduler(_beep, split=_first_word, units=_text_of, finish=_whole, finish_on="request")
