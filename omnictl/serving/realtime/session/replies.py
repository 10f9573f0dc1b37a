"""The session's replies: responses (at most one in progress), and the early answer started
when speech pauses, held until the turn is confirmed.

**Responses.** One is built from the session's settings and the client's ``response.create``
(:meth:`Replies.prepare`), and runs in a task
(:class:`~omnictl.serving.realtime.responses.ResponseRun`, which streams it); every one ends
with ``response.done``, after which the shell is told (``on_done``), with whether its audio
still plays on a track the server drives (WebRTC): a reply lives until it has been heard.

**Early answers** (issue 39, Build 3). The turn detection says a pause
(:class:`~omnictl.serving.realtime.vad.SpeechPaused`, ``preempt_ms`` of silence, before the
silence or the turn model confirms the turn); the turn-taking core decides to answer early
(:mod:`omnictl.serving.realtime.turn_taking`), and :meth:`Replies.start_early` transcribes the
buffer so far and submits the response's pipeline request with that tentative turn at the end
of the conversation (:meth:`ResponseRun.prepare`): the thinker prefills and writes, the TTS
synthesises its first clause. Nothing of it is sent and nothing is added to the conversation.

- The turn is confirmed where it paused: the user item is committed as always, its transcript
  is the one the answer heard, and the held response is released (:meth:`Replies.release`):
  ``response.created`` and every event as any response's, the ones that waited first.
- The user speaks again, a client event changes the conversation, or the session closes: the
  answer is dropped (:meth:`Replies.drop_early`): its pipeline requests aborted everywhere,
  nothing sent, nothing kept. Logged once at info with the request ids, marked
  ``preemptive_dropped`` on the turn's milestones, counted on
  ``omnictl_realtime_preemptive_answers_total{outcome="dropped"}``, the seconds from its start
  to the drop (what its requests may have computed for nothing) on
  ``omnictl_realtime_preemptive_dropped_seconds_total``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import msgspec
import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.audio.resample import StreamResampler
from omnictl.inputs import PCM16_RATE, ChatRequest
from omnictl.outputs import Transcript
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import EchoGuard
from omnictl.serving.realtime.formats import codec_for
from omnictl.serving.realtime.responses import ResponseRun
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.session.milestones import DROPPED, TurnClock
from omnictl.serving.realtime.session.settings import (
    RESPONSE_UNHONOURED,
    TEMPERATURE,
    in_range,
    known_voice,
    max_tokens,
    metadata,
    modalities,
    no_tools,
    unhonoured,
)
from omnictl.serving.realtime.session.transcripts import LiveTurn, Transcriber
from omnictl.serving.realtime.turns import Turn
from omnictl.serving.realtime.vad import VAD_RATE

log = logging.getLogger("omnictl.serving.realtime")

Build = Callable[[Sequence[Turn]], ChatRequest]


@dataclass
class Preempted:
    """One early answer, from the pause to its release or drop."""

    item_id: str  # the user item the turn becomes when confirmed
    audio: np.ndarray  # the buffer at the pause (float, 24 kHz): what the answer heard
    run: ResponseRun
    build: Build  # the run's request, of these items
    before: list[Turn]  # the conversation at the pause: what the answer hears before the turn
    transcribe_id: str | None  # the transcription's request id (None: the pipeline hears the audio)
    live: LiveTurn | None = None  # the turn's transcription while spoken: the answer hears its transcript so far
    transcript: Transcript | None = None  # what the answer heard, once transcribed
    heard_at_ns: int | None = None  # when (monotonic ns): the turn's transcript_final, marked at the release
    task: asyncio.Task[None] | None = None  # transcribes, then submits the response
    started_ns: int = field(default_factory=time.monotonic_ns)  # its start (the pause)

    def request_ids(self) -> str:
        """Its requests that may still run: the transcription until it has heard, the response."""
        transcribing = self.transcribe_id if self.transcript is None else None
        ids = [i for i in (transcribing, self.run.request_id) if i is not None]
        return ", ".join(ids) or "none"


class Replies:
    def __init__(
        self,
        ctx: SessionContext,
        transcriber: Transcriber,
        echo: EchoGuard,
        hears_speech: Callable[[], bool],
        on_done: Callable[[ResponseRun, bool], None],
        on_ready: Callable[[str, bool], None] = lambda item_id, heard: None,
    ) -> None:
        self.ctx = ctx
        self.transcriber = transcriber
        self.echo = echo
        self._hears_speech = hears_speech  # turn detection is on (only it can mistake echo for speech)
        self._on_done = on_done  # a response's task ended: (its run, whether its audio still plays)
        # A released early answer is ready: (its turn's item id, whether it heard the turn). The
        # turn-taking core says what the turn's transcript is then (adopt, or transcribe).
        self._on_ready = on_ready
        self._released: dict[str, tuple[Turn, Preempted, LiveTurn | None]] = {}  # by item id, until ready
        self.response: tuple[ResponseRun, asyncio.Task[None]] | None = None  # the one generating
        self.early: Preempted | None = None  # the answer started at a pause, held
        self.discarding: set[asyncio.Task[None]] = set()  # dropped ones' aborts, awaited (not cancelled) at close
        # the answers' audio at 16 kHz for the echo guard's reference: one stream, as the microphone's
        self._echo_16k = StreamResampler(PCM16_RATE, VAD_RATE, "fast")

    # --- responses --------------------------------------------------------------------------

    def start(self, config: ev.ResponseConfig, event_id: str | None) -> ResponseRun:
        """A response to the whole conversation, as ``config`` says, running from now on."""
        run, build = self.prepare(config, event_id, self._unanswered_clock())
        self.respond(run, lambda: build(self.ctx.conversation.turns))
        return run

    def _unanswered_clock(self) -> TurnClock | None:
        """The latest turn's milestones, if it has no answer yet (a later response, e.g. to a
        text item, is no turn's)."""
        clock = self.ctx.turn_clock
        return clock if clock is not None and "response_started" not in clock.stamps else None

    def prepare(
        self, config: ev.ResponseConfig, event_id: str | None, clock: TurnClock | None
    ) -> tuple[ResponseRun, Build]:
        """A response as the session's settings and ``config`` say, not started; and what
        builds its request from the items given (the conversation's, as a rule)."""
        no_tools(config.tools, config.tool_choice, "response", event_id)
        unhonoured(config, RESPONSE_UNHONOURED, "response", event_id)
        ctx = self.ctx
        s = ctx.settings
        codec, voice_name = s.output_codec, s.voice  # the session's, unless this response sets its own
        out = config.audio.output if config.audio is not msgspec.UNSET else msgspec.UNSET
        if out is not msgspec.UNSET and out.format is not msgspec.UNSET:
            codec = codec_for(out.format, "response.audio.output.format", event_id)
        if out is not msgspec.UNSET and out.voice is not msgspec.UNSET:
            voice_name = known_voice(ctx.pipeline.topology, out.voice, "response.audio.output.voice", event_id)
        tags = None if config.metadata is msgspec.UNSET else metadata(config.metadata, "response.metadata", event_id)
        wanted = s.output_modalities
        if config.output_modalities is not msgspec.UNSET:
            wanted = modalities(ctx.pipeline.topology, config.output_modalities, "response.output_modalities", event_id)
        limit = None
        if config.max_output_tokens is not msgspec.UNSET:
            limit = max_tokens(config.max_output_tokens, "response.max_output_tokens", event_id)
        temperature = None
        if config.temperature is not msgspec.UNSET:
            temperature = in_range(config.temperature, TEMPERATURE, "response.temperature", event_id)
        instructions = s.instructions if config.instructions is msgspec.UNSET else config.instructions
        voice = None if voice_name in OPENAI_VOICES else voice_name
        sampling = s.sampling(limit, temperature)
        effective = s.max_output_tokens if limit is None else limit
        run = ResponseRun(
            ev.new_id("resp"),
            wanted,
            ctx.send,
            ctx.state,
            ctx.pipeline,
            traceparent=ctx.traceparent,
            codec=codec,
            on_audio=self._sent_audio,
            audio_out=ctx.audio_out,
            clock=clock,
            max_output_tokens=effective if isinstance(effective, int) else "inf",
            metadata=tags,
        )
        speed = s.speed
        return run, lambda turns: ctx.conversation.request(instructions, sampling, voice, turns, speed=speed)

    def respond(
        self,
        run: ResponseRun,
        build: Callable[[], ChatRequest],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``run`` becomes the session's response, sent in a task (after ``ready``, if given)."""
        ctx = self.ctx

        async def respond() -> None:
            try:
                if ready is not None:
                    await ready()
                await run.run(ctx.conversation, build)
            finally:
                playing = False
                if ctx.audio_out is not None:
                    playing = bool(ctx.audio_out.finish(run.id))
                if self.response is not None and self.response[0] is run:
                    self.response = None
                self._on_done(run, playing)

        self.response = (run, ctx.spawn(respond()))

    def _sent_audio(self, pcm: bytes) -> None:
        if self.echo.enabled and self._hears_speech():  # only speech detection can mistake echo for speech
            self.echo.sent(self._echo_16k.push(pcm16_to_float(pcm)))

    def stop_playing(self) -> None:
        """The answer's audio stops playing: the client stops it (a WebSocket), or the
        outbound track drops what it holds (WebRTC, which says so: ``output_audio_buffer.cleared``)."""
        self.echo.stop()
        if self.ctx.audio_out is not None:
            self.ctx.audio_out.clear()

    async def cancel(self, reason: str) -> None:
        """The response in progress stops playing, is cancelled, and sends its last events."""
        if self.response is None:
            return
        run, task = self.response
        self.stop_playing()
        await run.cancel(reason)
        await asyncio.shield(task)

    def cut_to_heard(self, run: ResponseRun) -> None:
        """A reply done generating but still playing on the track (WebRTC) stops: the track
        drops the rest (``output_audio_buffer.cleared``), and its item keeps the words heard
        (``conversation.item.truncated``), as a barge-in over a reply still generating does."""
        audio_out = self.ctx.audio_out
        assert audio_out is not None
        heard = audio_out.played_ms(run.id)
        self.echo.stop()
        # Nothing left to clear: it had finished playing meanwhile (heard whole), or a reply
        # ahead of it on the track was cleared with it just now (heard as far as it played).
        audio_out.clear()
        turn = run.turn
        if turn is None or not turn.spoken or turn.deleted or turn.truncated_ms is not None:
            return
        if heard >= turn.audio_ms:
            return
        turn.truncate(int(min(heard, turn.audio_ms)))
        assert turn.truncated_ms is not None
        self.ctx.send(ev.ItemTruncated(item_id=turn.id, content_index=0, audio_end_ms=turn.truncated_ms))

    # --- early answers ----------------------------------------------------------------------

    def start_early(self, item_id: str, buffered: bytes) -> None:
        """Start answering the turn ``item_id`` as the buffer has it now, held from the client."""
        ctx = self.ctx
        clock = ctx.turn(item_id)
        clock.mark("preempted")
        run, build = self.prepare(ev.ResponseConfig(), None, clock)
        p = Preempted(
            item_id,
            pcm16_to_float(buffered),
            run,
            build,
            list(ctx.conversation.turns),
            ev.new_id("transcribe") if ctx.can_transcribe else None,
            live=self.transcriber.live
            if self.transcriber.live is not None and self.transcriber.live.item_id == item_id
            else None,
        )
        p.task = ctx.spawn(self._early_run(p))
        self.early = p

    async def _early_run(self, p: Preempted) -> None:
        """Transcribe the buffer at the pause, then submit the answer with it as the last turn.
        Cancelled (a drop), each request's own cleanup aborts it; :meth:`ResponseRun.discard`
        aborts the response's."""
        if p.transcribe_id is not None:
            # The transcript so far, from the turn's live transcription (only its tail is
            # decoded); without one, or if it failed, the buffer at the pause decoded whole.
            heard = await self.transcriber.tentative(p.live) if p.live is not None else None
            if heard is None:
                heard, _ = await self.transcriber.recognise(
                    p.audio, p.item_id, p.transcribe_id
                )  # a failure is logged there
            if heard is None:
                return  # at the turn the commit transcribes it again, and the answer starts then
            p.transcript, p.heard_at_ns = heard, time.monotonic_ns()
            pending = Turn(id=p.item_id, role="user", text=heard.text, heard=True)
        else:  # the pipeline hears the audio itself
            pending = Turn(id=p.item_id, role="user", audio=p.audio, heard=True)
        await p.run.prepare(self.ctx.conversation, p.before, lambda: p.build([*p.before, pending]))

    def drop_early(self, why: str) -> None:
        """Drop the early answer, if any, everywhere: its requests are aborted in a task
        (in ``discarding`` until done, which a close awaits)."""
        p, self.early = self.early, None
        if p is None:
            return
        ctx = self.ctx
        log.info(
            "realtime session %s: preemptive answer to item %s dropped (%s); requests aborted: %s",
            ctx.id,
            p.item_id,
            why,
            p.request_ids(),
        )
        p.run.clock = None  # a submission still under way is no milestone of the turn, whose clock starts again
        if ctx.turn_clock is not None and ctx.turn_clock.id == p.item_id:
            ctx.turn_clock.mark(DROPPED, request=p.run.request_id)
        ctx.state.metrics.preemptive.labels("dropped").inc()
        ctx.state.metrics.preemptive_dropped_s.inc((time.monotonic_ns() - p.started_ns) / 1e9)
        discarding = ctx.spawn(self._discard(p))
        self.discarding.add(discarding)
        discarding.add_done_callback(self.discarding.discard)

    async def _discard(self, p: Preempted) -> None:
        if p.task is not None and not p.task.done():
            p.task.cancel()
            await asyncio.wait({p.task})  # its transcription's cleanup aborts that request
        failed = None if p.task is None or p.task.cancelled() else p.task.exception()
        if failed is not None:  # a bug: said here, once, or only by the garbage collector with no request id
            log.error(
                "realtime session %s: the dropped preemptive answer to item %s had failed (requests %s)",
                self.ctx.id,
                p.item_id,
                p.request_ids(),
                exc_info=failed,
            )
        await p.run.discard()

    def adopt_transcript(self, item_id: str) -> None:
        """The turn's transcript is the one its released early answer heard at the pause."""
        turn, p, live = self._released.pop(item_id)
        assert p.transcript is not None, f"item {item_id}: its early answer heard nothing to adopt"
        if live is not None:  # its live request is not needed any more
            self.transcriber.live_heard(turn, live, p.transcript, at_ns=p.heard_at_ns)
        else:
            self.transcriber.heard(turn, p.transcript, p.transcribe_id, at_ns=p.heard_at_ns)
        turn.transcribed.set()

    def transcribe_released(self, item_id: str) -> None:
        """The turn its released early answer did not hear is transcribed now, as any (its live
        transcription's input ends, or it is decoded whole)."""
        turn, _, live = self._released.pop(item_id)
        self.transcriber.transcribe(turn, live, was_detached=True)

    def release(self, turn: Turn) -> ResponseRun:
        """The turn ``turn`` (committed) is the one the early answer answered: once it is
        submitted, its transcript is the turn's and the held response goes out as the
        session's response."""
        p, self.early = self.early, None
        assert p is not None and p.item_id == turn.id, "released an early answer to another turn"
        ctx = self.ctx
        # The turn's live transcription, taken now: the next turn, which may start before the
        # answer is ready, opens its own.
        live = self.transcriber.detach()
        if live is not None and live.item_id != turn.id:  # another turn's (cannot be: the commit ended it)
            self.transcriber.live = live
            live = None

        async def ready() -> None:
            assert p.task is not None
            try:
                # Until it is ready, or the response is cancelled (a response.cancel, a barge-in):
                # then so is it (its requests aborted), rather than holding the session's
                # handlers up while it transcribes; the turn is then transcribed as any.
                await p.run._unless_cancelled(p.task)
            except asyncio.CancelledError:  # the session closed while it was getting ready
                self._released.pop(turn.id, None)
                await p.run.discard()
                raise
            failed = None if p.task.cancelled() else p.task.exception()
            if failed is not None:  # a bug in the early start must not leave the turn unanswered
                log.error(
                    "realtime session %s: the preemptive answer to item %s failed (requests %s); answered at the turn",
                    ctx.id,
                    p.item_id,
                    p.request_ids(),
                    exc_info=failed,
                )
            # Not transcribed at the pause (failed, cancelled, or the pipeline hears the audio):
            # the core says to transcribe the turn now; else to adopt what the answer heard.
            self._on_ready(turn.id, p.transcript is not None)
            if p.run.tracked is not None:
                ctx.state.metrics.preemptive.labels("used").inc()
            else:  # not submitted: run() submits it now, as without an early start
                log.info(
                    "realtime session %s: preemptive answer to item %s was not ready (requests %s): answered at the turn",
                    ctx.id,
                    p.item_id,
                    p.request_ids(),
                )
                ctx.state.metrics.preemptive.labels("dropped").inc()

        self._released[turn.id] = (turn, p, live)
        self.respond(p.run, lambda: p.build(ctx.conversation.turns), ready)
        return p.run
