"""The ``asr_stream`` stage: transcribes a streamed input while it arrives.

The request's input comes as stream chunks (``Pipeline.submit(None, input_stream=True)``,
then ``send(chunk)`` and ``end_input()``; or a ``stream_to`` upstream), each one of:

- an :class:`~omnictl.outputs.AudioChunk` (float32 mono at its ``sample_rate``);
- ``bytes``: PCM16 little-endian mono at the stage's ``pcm16_rate`` (24 kHz: the Realtime
  protocol's ``pcm16``);
- a dict ``{"context": str}`` before any audio: the conversation so far, which primes the
  decoder (Whisper's previous-text prompt);
- a dict ``{"tentative": True}`` at any point: the transcript so far is wanted now (an answer
  started at a pause, before the input ends). It goes out as a stream chunk, a
  :class:`~omnictl.outputs.Transcript` whose ``task`` is :data:`TENTATIVE` and whose ``text``
  is the whole transcript so far (not a delta), decoded from the tail only
  (:meth:`~omnictl.models.voice_assistant.incremental_asr.IncrementalTranscriber.tentative`).

Audio is resampled to 16 kHz by one streaming resampler per request
(:class:`~omnictl.audio.resample.StreamResampler`, FFmpeg's kept open: no chunk edge is
filtered on its own, and each sample is resampled once, where the whole input was resampled
again at every pass) and fed to an
:class:`~omnictl.models.voice_assistant.incremental_asr.IncrementalTranscriber`. Each word
it confirms is streamed at once as a :class:`~omnictl.outputs.Transcript` whose ``text`` is
the delta (a ``transcript`` terminal's stream chunk: a partial transcript); when the input
ends, the rest of the transcript goes out as the last delta (the deltas concatenate to the
transcript) and the whole :class:`~omnictl.outputs.Transcript` is the result.

**The voice assistant's own recogniser.** With ``whole`` (what :func:`listening_asr` gives
the topology's ``asr`` stage), a request that comes whole (a ``new_request``: a spoken chat
question, a transcription) is decoded by it on the same Whisper and in the same worker thread,
so one Whisper serves both; a streamed request comes through the entry stage
(:class:`~omnictl.models.voice_assistant.stages.ListeningEntry`), and its result goes out when
both its input has ended and the entry's own result (``{"listened": True}``) has come
(``result_on="request"``), in the shape the whole decode gives (``messages`` and ``transcript``).

Decoding runs in one worker thread (the model's CPU is shared by every request of the
stage: :class:`~omnictl.schedulers.worker.WorkerScheduler`), one step at a time: a request's
audio that arrives while a pass runs waits and is decoded in its next pass at once, so a slow
pass never queues one pass per chunk; and the next step is the most urgent request's (one
whose transcript is wanted now: a tentative one, or its input ended), then the one waiting
longest, so with several sessions a turn's tail waits for the step running, not for every
other session's passes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Literal, Mapping

import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.audio.resample import StreamResampler
from omnictl.exceptions import InvalidRequest
from omnictl.logs import request_scope
from omnictl.models.voice_assistant.asr import SAMPLE_RATE
from omnictl.models.voice_assistant.incremental_asr import (
    IncrementalSettings,
    IncrementalTranscriber,
    WhisperDecoder,
)
from omnictl.outputs import TENTATIVE, AudioChunk, Transcript
from omnictl.profiling.events import EventKind
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from omnictl.schedulers.worker import WorkerScheduler

log = logging.getLogger(__name__)

Whole = Callable[[dict[str, Any]], Generator[Transcript, None, dict[str, Any]]]


@dataclass(slots=True)
class _Utterance:
    transcriber: IncrementalTranscriber | None = None  # made with the first audio (after any context)
    context: str = ""
    rate: int | None = None  # the input's sample rate (one per request)
    raw: list[np.ndarray] = field(default_factory=list)  # samples received the worker has not taken, at `rate`
    raw_samples: int = 0  # received in all
    fed: int = 0  # 16 kHz samples handed to the transcriber
    taken: int = 0  # raw samples the worker has taken
    resampler: StreamResampler | None = None  # `rate` to 16 kHz, made with the first audio
    ended: bool = False
    tentative: bool = False  # the transcript so far is asked for (a {"tentative": True} chunk)
    final: Transcript | None = None  # the transcript, once the input ended and was decoded
    requested: bool = False  # the entry's result came (result_on="request")
    emitted: bool = False  # the result went out
    busy: bool = False  # a job is queued or running for it
    failed: bool = False  # aborted or failed: its job stops at the next step
    lock: threading.Lock = field(default_factory=threading.Lock)


class StreamingAsrScheduler(WorkerScheduler):
    """Streamed audio in, confirmed words streamed out, the transcript as the result."""

    worker_name = "asr"

    def __init__(
        self,
        decoder: WhisperDecoder,
        settings: IncrementalSettings,
        *,
        language: str = "en",
        pcm16_rate: int = 24_000,
        whole: Whole | None = None,
        result_on: Literal["stream_done", "request"] = "stream_done",
    ) -> None:
        super().__init__()
        if pcm16_rate <= 0:
            raise ValueError(f"pcm16_rate: must be a positive rate in Hz, got {pcm16_rate}")
        if result_on not in ("stream_done", "request"):
            raise ValueError(f"result_on: must be 'stream_done' or 'request', got {result_on!r}")
        self.decoder = decoder
        self.settings = settings
        self.language = language
        self.pcm16_rate = pcm16_rate
        self.whole = whole
        self.result_on = result_on
        self._utterances: dict[str, _Utterance] = {}
        self._wholes: set[str] = set()  # whole requests queued or decoding (abort: their output is dropped)
        # utterances with a step to make, not making it, in the order they asked (see _work_next)
        self._ready: dict[str, _Utterance] = {}
        self._ready_lock = threading.Lock()
        self._ended = RecentIds()  # finished, failed or aborted: late chunks are ignored

    def abort(self, request_id: str) -> None:
        utterance = self._utterances.pop(request_id, None)
        if utterance is not None:
            with utterance.lock:
                utterance.failed = True  # its job, if any, stops before its next decode
                utterance.raw.clear()
        self._wholes.discard(request_id)
        self._ended.add(request_id)

    def load(self) -> SchedulerLoad:
        streams = len(self._utterances)
        return SchedulerLoad(running=streams + len(self._wholes), stream_buffers=streams)

    # --- event loop: take the chunks ------------------------------------------------------

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if rid in self._ended:
            return
        if message.kind is IncomingKind.NEW_REQUEST:
            self._new_request(rid, message.data)
            return
        if rid in self._wholes:
            return  # a whole request's (the entry's result ends its stream to us, empty, too)
        if message.kind is IncomingKind.STREAM_DONE and rid not in self._utterances and self.result_on == "request":
            return  # nothing streamed: the entry's result, next, says whether it was a whole request
        utterance = self._utterances.setdefault(rid, _Utterance())
        if message.kind is IncomingKind.STREAM_CHUNK:
            try:
                self._add(utterance, message.data)
            except InvalidRequest as exc:
                self._fail(rid, utterance, str(exc), exc)
                return
        elif message.kind is IncomingKind.STREAM_DONE:
            utterance.ended = True
        self._wake(rid, utterance)

    def _new_request(self, rid: str, data: Any) -> None:
        """A whole request (decoded by ``whole``), or the entry's result ending a streamed one."""
        if isinstance(data, Mapping) and data.get("listened"):
            utterance = self._utterances.get(rid)
            if utterance is None:  # it streamed nothing at all: an empty transcript
                utterance = self._utterances[rid] = _Utterance(ended=True)
                utterance.final = Transcript(text="", language=self.language)
            with utterance.lock:
                utterance.requested = True
            self._complete(rid, utterance)
            return
        if self.whole is None:
            self._ended.add(rid)
            self.emit(
                OutgoingMessage(
                    OutgoingKind.ERROR,
                    rid,
                    error=f"stage {self.stage_name}: takes a streamed input (input_stream=True), got a whole one",
                )
            )
            return
        self._wholes.add(rid)
        self.submit(self._whole, rid, data)

    def _complete(self, rid: str, utterance: _Utterance) -> None:
        """The streamed request's result, once it is decoded (and, with ``result_on="request"``,
        the entry's result came): from the worker thread or the loop, whichever is last."""
        with utterance.lock:
            ready = (
                utterance.final is not None
                and (utterance.requested or self.result_on == "stream_done")
                and not utterance.emitted
                and not utterance.failed
            )
            if ready:
                utterance.emitted = True
        if not ready:
            return
        heard = utterance.final
        assert heard is not None
        self._ended.add(rid)
        self._utterances.pop(rid, None)
        result: Any = heard
        if self.result_on == "request":  # the whole decode's shape: the question's text, and what was heard
            result = {"messages": [{"role": "user", "content": heard.text}], "transcript": heard}
        self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def _add(self, utterance: _Utterance, data: Any) -> None:
        if isinstance(data, dict) and set(data) == {"tentative"}:
            if data["tentative"] is not True:
                raise InvalidRequest("input.tentative: must be true", field="input.tentative")
            utterance.tentative = True
            return
        if isinstance(data, dict) and set(data) == {"context"}:
            if utterance.raw_samples:
                raise InvalidRequest("input: the context chunk must come before any audio", field="input")
            if not isinstance(data["context"], str):
                raise InvalidRequest(
                    f"input.context: must be a str, got {type(data['context']).__name__}", field="input.context"
                )
            utterance.context = data["context"]
            return
        if isinstance(data, AudioChunk):
            samples, rate = data.samples, data.sample_rate
        elif isinstance(data, (bytes, bytearray, memoryview)):
            if len(data) % 2:
                raise InvalidRequest(f"input: PCM16 audio has an odd number of bytes ({len(data)})", field="input")
            samples, rate = pcm16_to_float(data), self.pcm16_rate
        else:
            raise InvalidRequest(
                "input: a chunk must be an AudioChunk, PCM16 bytes or {'context': str} before the audio, "
                f"got {type(data).__name__}",
                field="input",
            )
        if utterance.rate is not None and rate != utterance.rate:
            raise InvalidRequest(
                f"input: sample_rate changed from {utterance.rate} to {rate} Hz within one input", field="input"
            )
        utterance.rate = rate
        with utterance.lock:
            utterance.raw.append(np.asarray(samples, dtype=np.float32).reshape(-1))
            utterance.raw_samples += utterance.raw[-1].size

    def _wake(self, rid: str, utterance: _Utterance) -> None:
        with utterance.lock:
            if utterance.busy:
                return  # its queued or running step takes the new audio (or the end)
            utterance.busy = True
        self._ready_up(rid, utterance)

    def _ready_up(self, rid: str, utterance: _Utterance) -> None:
        """``utterance`` has a step to make: one job more, which steps whichever is most urgent."""
        with self._ready_lock:
            self._ready[rid] = utterance
        self.submit(self._work_next)

    def _work_next(self) -> None:
        """One step of the most urgent utterance waiting: one whose transcript is wanted now
        (a tentative one asked for at a pause, or its input ended) before the passes made
        while others speak, else the one waiting longest; one that has more to do goes to
        the back. With several sessions on one Whisper, a turn's tail never waits behind
        every other session's passes, only the step running."""
        with self._ready_lock:
            if not self._ready:
                return
            rid = next((r for r, u in self._ready.items() if u.tentative or u.ended), next(iter(self._ready)))
            utterance = self._ready.pop(rid)
        if self._work(rid, utterance):
            self._ready_up(rid, utterance)

    def _fail(self, rid: str, utterance: _Utterance, reason: str, exc: BaseException | None) -> None:
        with utterance.lock:
            utterance.failed = True
            utterance.raw.clear()
        self._utterances.pop(rid, None)
        self._ended.add(rid)
        field_name = exc.field if isinstance(exc, InvalidRequest) else None
        self.emit(
            OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}", field=field_name)
        )

    # --- worker thread: decode --------------------------------------------------------------

    def _work(self, rid: str, utterance: _Utterance) -> bool:
        """One step; True when the utterance has more to do (it stays busy)."""
        try:
            with request_scope(rid):
                return self._step(rid, utterance)
        except Exception as exc:  # the request fails; the stage logs the traceback once
            with utterance.lock:
                utterance.failed = True
                utterance.busy = False
            self._ended.add(rid)
            self._utterances.pop(rid, None)
            field_name = exc.field if isinstance(exc, InvalidRequest) else None
            self.emit(
                OutgoingMessage(
                    OutgoingKind.ERROR,
                    rid,
                    error=f"stage {self.stage_name}: decoding failed: {type(exc).__name__}: {exc}",
                    field=field_name,
                    exc=exc,
                )
            )
            return False

    def _step(self, rid: str, utterance: _Utterance) -> bool:
        """One pass over what came since the last; False when there is nothing left to do."""
        with utterance.lock:
            if utterance.failed or utterance.final is not None:  # failed, or done (its result may wait)
                utterance.busy = False
                return False
            fresh = utterance.raw_samples > utterance.taken
            audio = np.concatenate(utterance.raw) if fresh and utterance.raw else None
            if audio is not None:
                utterance.raw.clear()  # taken: each sample is resampled once
                utterance.taken += audio.size
            tentative, utterance.tentative = utterance.tentative, False
            ending = utterance.ended and not fresh and not tentative
            if audio is None and not ending and not tentative:
                utterance.busy = False
                return False
        if utterance.transcriber is None:
            utterance.transcriber = IncrementalTranscriber(self.decoder, self.settings, context=utterance.context)
        transcriber = utterance.transcriber
        if audio is not None:
            assert utterance.rate is not None  # set with the first audio
            if utterance.resampler is None:
                utterance.resampler = StreamResampler(utterance.rate, SAMPLE_RATE)
            new = utterance.resampler.push(audio)
            utterance.fed += new.size
            with self.busy():
                delta = transcriber.feed(new, decode=not tentative)  # a tentative decode hears it next
            self._stream(rid, utterance, delta)
        if tentative:
            with self.busy():
                delta, text = transcriber.tentative()
            self._stream(rid, utterance, delta)
            if not utterance.failed:
                self.emit(
                    OutgoingMessage(
                        OutgoingKind.STREAM,
                        rid,
                        Transcript(
                            text=text, language=self.language, duration=utterance.fed / SAMPLE_RATE, task=TENTATIVE
                        ),
                    )
                )
        if audio is not None or tentative:
            return True
        with self.busy():
            before = transcriber.confirmed_text
            if utterance.resampler is not None:  # the filter's last few ms
                tail = utterance.resampler.flush()
                utterance.fed += tail.size
                transcriber.feed(tail, decode=False)  # the final decode hears it
            text = transcriber.finish()
        self._stream(rid, utterance, text[len(before) :])
        with utterance.lock:
            if utterance.failed:
                utterance.busy = False
                return False
            utterance.busy = False
            seconds = utterance.fed / SAMPLE_RATE
            utterance.final = Transcript(text=text, language=self.language, duration=seconds)
        log.debug("transcribed %.2f s in %d passes", seconds, transcriber.passes)
        self._complete(rid, utterance)
        return False

    def _whole(self, rid: str, data: dict[str, Any]) -> None:
        """A whole request, by ``whole``: its streamed segments, then its result."""
        assert self.whole is not None
        self.profile(EventKind.BUILD_START, rid)  # the trace's span of the decode, as a function stage's
        try:
            with request_scope(rid), self.busy():
                steps = self.whole(data)
                while True:
                    if rid not in self._wholes:
                        return  # aborted meanwhile: nothing more of it
                    try:
                        segment = next(steps)
                    except StopIteration as done:
                        result = done.value
                        break
                    self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, segment))
        except Exception as exc:  # this request fails; the stage logs the traceback once
            if rid in self._wholes:
                self._wholes.discard(rid)
                self._ended.add(rid)
                field_name = exc.field if isinstance(exc, InvalidRequest) else None
                error = (
                    str(exc)
                    if isinstance(exc, InvalidRequest)
                    else f"stage {self.stage_name}: {type(exc).__name__}: {exc}"
                )
                self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=error, field=field_name, exc=exc))
            return
        if rid in self._wholes:
            self._wholes.discard(rid)
            self._ended.add(rid)
            self.profile(EventKind.BUILD_END, rid)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    def _stream(self, rid: str, utterance: _Utterance, delta: str) -> None:
        if delta and not utterance.failed:
            self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, Transcript(text=delta, language=self.language)))


def asr_stream(
    cadence_s: float = 0.4,
    beam_size: int = 5,
    pass_beam_size: int | None = None,
    window_padding_s: float = 8.0,
    max_segment_s: float = 20.0,
    holdback_words: int = 1,
    agreement: int = 2,
    quiet_rms: float = 0.01,
    language: str = "en",
    pcm16_rate: int = 24_000,
    cpu_threads: int = 0,
) -> Scheduler:
    """Whisper base, incrementally; every setting a ``factory_args`` key (see
    :class:`~omnictl.models.voice_assistant.incremental_asr.IncrementalSettings`)."""
    settings = IncrementalSettings(
        cadence_s=cadence_s,
        beam_size=beam_size,
        pass_beam_size=pass_beam_size,
        window_padding_s=window_padding_s,
        max_segment_s=max_segment_s,
        holdback_words=holdback_words,
        agreement=agreement,
        quiet_rms=quiet_rms,
    )
    return StreamingAsrScheduler(
        WhisperDecoder.load(language, cpu_threads), settings, language=language, pcm16_rate=pcm16_rate
    )
