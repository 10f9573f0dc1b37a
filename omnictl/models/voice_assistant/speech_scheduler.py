"""The TTS stage's scheduler: speaks each sentence as soon as the streamed text completes it.

Sentences wait in a queue per request, synthesized one at a time by a worker thread
(Piper is not thread-safe and the CPU is the limit anyway), so requests interleave
sentence by sentence and a request's audio stays in order. Which request's sentence goes
next is the audio policy's choice (:mod:`omnictl.playback.policy`): ``fifo``, the oldest
queued sentence, except that a request none of whose audio is spoken yet goes first (a turn's
first clause ahead of other sessions' later sentences: those have audio playing, the new one
has silence until it is spoken); ``deadline``, the request whose listener runs out of audio soonest, and
a sentence too long to synthesise within the audio its listeners have in hand is spoken in
pieces sized from the measured synthesis speed (a ramp: :meth:`_ramp_chars`).
Under both, a request's first piece is a short clause of a few words (the splitter's
``first_words``), later pieces end at commas too, and a playing request about to run out
of audio gets the whole words written so far of its unfinished sentence (:meth:`_running_dry`),
so first audio waits for a few tokens and the rest follows without gaps.
After its last sentence, a request's whole waveform is the result. Output follows the audio terminal contract: an
:class:`~omnictl.outputs.AudioChunk` per sentence, then an :class:`~omnictl.outputs.AudioResult`
for the whole answer.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from omnictl.exceptions import describe_error
from omnictl.inputs import SPEECH_SAMPLING
from omnictl.models.voice_assistant.text_stream import FollowedText, TextStreamFollower
from omnictl.models.voice_assistant.tts import (
    DEFAULT_VOICE,
    FIRST_WORDS,
    RAMP_MIN_CHARS,
    RAMP_MIN_TAIL_CHARS,
    VOICES,
    PiperSpeaker,
    SentenceSplitter,
    fit_piece,
    ramp_chars,
    speakable,
)
from omnictl.outputs import AudioChunk, AudioResult, TextResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S, PlaybackDeadlines
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import OutgoingKind, OutgoingMessage, SchedulerLoad


@dataclass(slots=True)
class _Speech:
    voice: str
    splitter: SentenceSplitter
    speed: float = 1.0
    audio: list[np.ndarray] = field(default_factory=list)
    transcript: list[str] = field(default_factory=list)
    text_done: bool = False  # the whole text has been queued: it asks nothing more of the worker


# Under `deadline`, the piece synthesised next takes at most this share of the least audio a
# playing listener has left (at the measured speed): the speed is a moving average, and on
# the loaded machine one synthesis took three times what its like did.
RAMP_SHARE = 0.5
# A playing stream whose listener has less than this (beyond the synthesis of the words in
# hand) left, and nothing queued, gets the words written so far of its unfinished sentence:
# a second covers a short piece's synthesis and a slow token or two.
RUNNING_DRY_S = 1.0
# ... and once it has less than this left, words from RAMP_MIN_TAIL_CHARS (two or three) go:
# after a first clause of a second or less ("I'm sorry,") a thinker writing six words a
# second had not written RAMP_MIN_CHARS more before it had played (a 0.44 s gap,
# benchmarks/tts_first_piece.py --words-per-s 6); a short piece sounds better than silence.
LAST_MOMENT_S = 0.5


_FINISH = None  # queue marker: the request's last sentence is queued before it


class SentenceSpeechScheduler(TextStreamFollower):
    def __init__(
        self,
        default_voice: str = DEFAULT_VOICE,
        max_sentence_chars: int = 250,
        speaker_factory: Callable[[str], PiperSpeaker] = PiperSpeaker,
        audio_policy: str = DEFAULT_POLICY,
        ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
        first_words: tuple[int, int] | None = FIRST_WORDS,
    ) -> None:
        super().__init__()
        if default_voice not in VOICES:
            raise ValueError(f"unknown voice {default_voice!r}; installed voices: {', '.join(sorted(VOICES))}")
        self.default_voice = default_voice
        self._speaker_factory = speaker_factory
        self._speakers: dict[str, PiperSpeaker] = {}
        self._max_sentence_chars = max_sentence_chars
        # None: the first piece is a sentence (or 40-60 characters) and later pieces whole
        # sentences, as before the short first clause (kept to compare: tts_first_piece.py)
        self._first_words = first_words
        SentenceSplitter(max_sentence_chars, first_words=first_words)  # a bad pair fails here, naming it
        self._speech: dict[str, _Speech] = {}
        # request -> its queued sentences in order, each with its place in the arrival order
        self._pending: dict[str, collections.deque[tuple[int, str | None]]] = {}
        self._arrivals = itertools.count()
        self._has_work = asyncio.Event()
        self.deadlines = PlaybackDeadlines(audio_policy, ttfp_target_s)
        self._synthesis_s_per_char: float | None = None  # measured: what the next sentence will cost
        self._worker: asyncio.Task[None] | None = None

    def speaker(self, voice: str) -> PiperSpeaker:
        if voice not in self._speakers:
            self._speakers[voice] = self._speaker_factory(voice)
        return self._speakers[voice]

    async def start(self) -> None:
        await super().start()
        self._worker = asyncio.create_task(self._speak_forever(), name="tts-worker")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        await super().stop()

    def load(self) -> SchedulerLoad:
        # queued: sentences; waiting_requests: requests with sentences queued (backpressure counts those)
        return SchedulerLoad(
            queued=sum(len(queue) for queue in self._pending.values()),
            running=len(self._speech),
            stream_buffers=len(self.requests),
            waiting_requests=len(self._pending),
        )

    def abort(self, request_id: str) -> None:
        super().abort(request_id)
        self._speech.pop(request_id, None)
        self._pending.pop(request_id, None)
        self.deadlines.finished(request_id)

    # --- following the text ----------------------------------------------------------

    def on_text(self, request_id: str, state: FollowedText, delta: str) -> None:
        speech = self._speech_of(request_id, state)
        if speech is not None:
            self._queue(request_id, speech.splitter.feed(delta))
            if self._running_dry(request_id, speech):
                slack = self.deadlines.slack(request_id, time.monotonic())
                least = RAMP_MIN_CHARS if slack >= LAST_MOMENT_S else RAMP_MIN_TAIL_CHARS
                self._queue(request_id, [speech.splitter.take_words(least)])

    def on_stream_done(self, request_id: str, state: FollowedText) -> None:
        speech = self._speech.get(request_id)
        if speech is not None:  # the text is complete: its last sentence need not wait for the result
            self._queue(request_id, speech.splitter.flush())

    def on_complete(self, request_id: str, state: FollowedText, result: TextResult) -> None:
        speech = self._speech_of(request_id, state)
        if speech is not None:
            self._queue(request_id, speech.splitter.flush())
            speech.text_done = True
            self._enqueue(request_id, _FINISH)

    def _speech_of(self, request_id: str, state: FollowedText) -> _Speech | None:
        speech = self._speech.get(request_id)
        if speech is None:
            voice = state.params.get("voice") or self.default_voice
            if voice not in VOICES:
                self.fail(
                    request_id,
                    f"voice {voice!r} is not installed; this stage speaks with: {', '.join(sorted(VOICES))}",
                    field="audio.voice",
                )
                return None
            asked = sorted(state.params.get(SPEECH_SAMPLING) or {})
            if asked:  # Piper's voices are not sampled token by token: nothing here to steer
                self.fail(
                    request_id,
                    f"this stage speaks with Piper, which cannot honour sampling.{asked[0]} "
                    "(it takes voice, speed and the text only); send the request without it",
                    field=f"sampling.{asked[0]}",
                )
                return None
            speed = state.params.get("speed") or 1.0
            splitter = SentenceSplitter(
                self._max_sentence_chars,
                first_words=self._first_words,
                clause_chars=RAMP_MIN_CHARS if self._first_words is not None else None,
            )
            speech = self._speech[request_id] = _Speech(voice, splitter, float(speed))
        return speech

    def _queue(self, request_id: str, sentences: list[str]) -> None:
        for sentence in sentences:
            if speakable(sentence):
                self._enqueue(request_id, sentence)

    def _enqueue(self, request_id: str, sentence: str | None) -> None:
        self._pending.setdefault(request_id, collections.deque()).append((next(self._arrivals), sentence))
        self.deadlines.arrived(request_id, time.monotonic())
        self._has_work.set()

    async def _next(self) -> tuple[str, str | None]:
        """The next (request, sentence) the policy picks; a finished request's end marker
        first, as it costs nothing and frees its place."""
        while not self._pending:
            self._has_work.clear()
            await self._has_work.wait()
        waiting = sorted(self._pending, key=lambda rid: self._pending[rid][0][0])  # oldest sentence first
        done = next((rid for rid in waiting if self._pending[rid][0][1] is _FINISH), None)
        now = time.monotonic()
        max_chars = self._ramp_chars(now)
        request_id = done
        if request_id is None and self.deadlines.policy == "fifo":
            # a first clause ahead of later sentences (the oldest such first): a few words'
            # synthesis, while the others' listeners have audio in hand
            request_id = next((rid for rid in waiting if not self._spoken(rid)), None)
        if request_id is None:
            request_id = self.deadlines.pick(waiting, now, lambda rid: self._cost(rid, max_chars))
        queue = self._pending[request_id]
        order, sentence = queue.popleft()
        if sentence is not None and max_chars is not None:
            sentence, rest = fit_piece(sentence, max_chars)
            if rest:  # the rest keeps the sentence's place, first in the request's queue
                queue.appendleft((order, rest))
        if not queue:
            del self._pending[request_id]
        return request_id, sentence

    def _spoken(self, request_id: str) -> bool:
        """Whether some of the request's audio has been spoken (its first piece is done)."""
        speech = self._speech.get(request_id)
        return speech is None or bool(speech.audio)

    def _running_dry(self, request_id: str, speech: _Speech) -> bool:
        """Whether a playing stream with nothing queued would run out of audio before the
        sentence being written ends and is synthesised, so the words written so far go now
        (the LLM writes slower on a loaded machine). Under either policy: the first piece
        is a short clause (about a second of audio), and the rest of its sentence would
        otherwise often come after it has played."""
        if request_id in self._pending:
            return False
        if not self.deadlines.playing(request_id):
            return False
        cost = (self._synthesis_s_per_char or 0.0) * len(speech.splitter.pending)
        return self.deadlines.slack(request_id, time.monotonic()) < cost + RUNNING_DRY_S

    def _ramp_chars(self, now: float) -> int | None:
        """The longest piece the worker may synthesise now (None: whole sentences). Under
        ``deadline``, a piece is cut so its synthesis fits in :data:`RAMP_SHARE` of the least
        audio any playing listener still waiting for more has left: Piper cannot be
        interrupted, so a long sentence would make that listener wait. The first piece is
        short, its audio pays for a longer second one, and so on (a ramp)."""
        if self.deadlines.policy != "deadline" or self._synthesis_s_per_char is None:
            return None
        slacks = [
            self.deadlines.slack(rid, now)
            for rid, speech in self._speech.items()
            if self.deadlines.playing(rid) and (not speech.text_done or rid in self._pending)
        ]
        if not slacks:
            return None
        return ramp_chars(RAMP_SHARE * min(slacks), self._synthesis_s_per_char)

    def _cost(self, request_id: str, max_chars: int | None = None) -> float:
        """Seconds the request's next piece is expected to take to synthesise."""
        sentence = self._pending[request_id][0][1]
        if self._synthesis_s_per_char is None or sentence is None:
            return 0.0
        chars = len(sentence) if max_chars is None else min(len(sentence), max_chars)
        return self._synthesis_s_per_char * chars

    # --- speaking --------------------------------------------------------------------

    async def _speak_forever(self) -> None:
        while True:
            request_id, sentence = await self._next()
            speech = self._speech.get(request_id)
            if speech is None:  # aborted or failed meanwhile
                continue
            if sentence is _FINISH:
                del self._speech[request_id]
                self.deadlines.finished(request_id)
                self._finish(request_id, speech)
                continue
            try:
                speaker = self.speaker(speech.voice)
                began = time.monotonic()
                with self.computing(request_id, "synthesis"):
                    audio = await asyncio.to_thread(speaker.synthesize, sentence, speech.speed)
                per_char = (time.monotonic() - began) / max(len(sentence), 1)
                previous = self._synthesis_s_per_char
                # a moving average: the speed follows the machine's load, one slow sentence does not swing it
                self._synthesis_s_per_char = per_char if previous is None else 0.7 * previous + 0.3 * per_char
            except Exception as exc:
                self._speech.pop(request_id, None)
                self._pending.pop(request_id, None)
                self.deadlines.finished(request_id)
                self.fail(request_id, f"speaking {sentence!r} failed: {describe_error(exc)}")
                continue
            if request_id not in self._speech:  # aborted while it was being spoken
                continue
            if not speech.audio:
                self.profile(EventKind.FIRST_EMIT, request_id)
            speech.audio.append(audio)
            speech.transcript.append(sentence)
            chunk = AudioChunk(samples=audio, sample_rate=speaker.sample_rate, transcript=sentence)
            self.deadlines.sent(request_id, audio.size / speaker.sample_rate, time.monotonic())
            self.emit(OutgoingMessage(OutgoingKind.STREAM, request_id, chunk))

    def _finish(self, request_id: str, speech: _Speech) -> None:
        audio = np.concatenate(speech.audio) if speech.audio else np.zeros(0, dtype=np.float32)
        result = AudioResult(
            samples=audio, sample_rate=self.speaker(speech.voice).sample_rate, transcript=" ".join(speech.transcript)
        )
        self.emit(OutgoingMessage(OutgoingKind.RESULT, request_id, result))
