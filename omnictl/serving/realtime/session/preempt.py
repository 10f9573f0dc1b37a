"""Preemptive answers (issue 39, Build 3): the answer starts when the user's speech pauses,
while the end of the turn is still being decided, and reaches the client only once the turn
is confirmed.

The turn detection says a pause (:class:`~omnictl.serving.realtime.vad.SpeechPaused`, after
:data:`~omnictl.serving.realtime.vad.PREEMPT_MS` of silence, before the silence or the turn
model confirms the turn). At once the session transcribes the buffer so far and submits
the response's pipeline request with that tentative turn at the end of the conversation
(:meth:`ResponseRun.prepare`): the thinker prefills and writes, the TTS synthesises its
first clause. Nothing of it is sent and nothing is added to the conversation: its request's
events wait in their stream, unread.

- The turn is confirmed (speech stopped where it paused): the user item is committed as
  always (``input_audio_buffer.committed``, ``conversation.item.added``), its transcript is
  the one the answer heard (what came after the pause is silence by the detector's own
  judgement), and the held response is released: ``response.created`` and every event as
  any response's, the ones that waited first.
- The user speaks again before that (:class:`~omnictl.serving.realtime.vad.SpeechResumed`),
  or any client event but an append comes (a commit, a clear, ``response.create``, an item,
  ``session.update``), or the session closes: the answer is dropped: its pipeline requests
  (transcription, response) aborted everywhere, nothing sent, nothing kept; listening goes
  on. Logged once at info with the request ids, marked ``preemptive_dropped`` on the turn's
  milestones, counted on ``omnictl_realtime_preemptive_answers_total{outcome="dropped"}``.

Only a session that answers its turns itself preempts (type ``realtime``, turn detection
with ``create_response``), only when no response is in progress, and not while a turn is
transcribed live (:mod:`.live`: its transcript is the live request's, final only once its
input ends; preempting there would end that input at every pause).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.inputs import PCM16_RATE, ChatRequest
from omnictl.outputs import Transcript
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.responses import ResponseRun
from omnictl.serving.realtime.session.core import SessionCore
from omnictl.serving.realtime.session.milestones import DROPPED
from omnictl.serving.realtime.turns import Turn

log = logging.getLogger("omnictl.serving.realtime")

MIN_PREEMPT_MS = 100  # less audio than a commit takes (input_audio.MIN_COMMIT_MS) is not answered


@dataclass
class Preempted:
    """One preemptive answer, from the pause to its release or drop."""

    item_id: str  # the user item the turn becomes when confirmed
    audio_end_ms: int  # where the speech paused: the turn is this one only if it stops there
    audio: np.ndarray  # the buffer at the pause (float, 24 kHz): what the answer heard
    run: ResponseRun
    build: Callable[[Sequence[Turn]], ChatRequest]  # the run's request, of these items
    before: list[Turn]  # the conversation at the pause: what the answer hears before the turn
    transcribe_id: str | None  # the transcription's request id (None: the pipeline hears the audio)
    transcript: Transcript | None = None  # what the answer heard, once transcribed
    heard_at_ns: int | None = None  # when (monotonic ns): the turn's transcript_final, marked at the release
    task: asyncio.Task[None] | None = None  # transcribes, then submits the response

    def request_ids(self) -> str:
        """Its requests that may still run: the transcription until it has heard, the response."""
        transcribing = self.transcribe_id if self.transcript is None else None
        ids = [i for i in (transcribing, self.run.request_id) if i is not None]
        return ", ".join(ids) or "none"


class Preemption(SessionCore):
    def _may_preempt(self) -> bool:
        vad = self.settings.vad
        return (
            vad is not None
            and vad.create_response
            and self.settings.type == "realtime"
            and self.response is None
            and self._preempt is None
            and self._live is None
            and self._held_start is None
            and self._speech_item is not None
        )

    def _speech_paused(self, audio_end_ms: int) -> None:
        """The speech paused: start answering the buffer so far, held from the client."""
        if not self._may_preempt() or len(self.buffer) / 2 / PCM16_RATE * 1000 < MIN_PREEMPT_MS:
            return
        assert self._speech_item is not None
        clock = self.turn(self._speech_item)
        clock.mark("preempted")
        run, build = self._response_run(ev.ResponseConfig(), None, clock)
        preempted = Preempted(
            self._speech_item,
            audio_end_ms,
            pcm16_to_float(bytes(self.buffer)),
            run,
            build,
            list(self.conversation.turns),
            ev.new_id("transcribe") if self.can_transcribe else None,
        )
        preempted.task = self._spawn(self._preempt_run(preempted))
        self._preempt = preempted

    async def _preempt_run(self, p: Preempted) -> None:
        """Transcribe the buffer at the pause, then submit the answer with it as the last turn.
        Cancelled (a drop), each request's own cleanup aborts it; :meth:`ResponseRun.discard`
        aborts the response's."""
        if p.transcribe_id is not None:
            heard, _ = await self._recognise(p.audio, p.item_id, p.transcribe_id)  # a failure is logged there
            if heard is None:
                return  # at the turn the commit transcribes it again, and the answer starts then
            p.transcript, p.heard_at_ns = heard, time.monotonic_ns()
            pending = Turn(id=p.item_id, role="user", text=heard.text, heard=True)
        else:  # the pipeline hears the audio itself
            pending = Turn(id=p.item_id, role="user", audio=p.audio, heard=True)
        await p.run.prepare(self.conversation, p.before, lambda: p.build([*p.before, pending]))

    def _preempt_take(self, item_id: str, audio_end_ms: int) -> Preempted | None:
        """The turn ``item_id`` is confirmed at ``audio_end_ms``: its preemptive answer, if it
        answered this very turn and no response is in progress (else any is dropped: a
        response starts only by dropping it, so never so, but never two at once)."""
        p = self._preempt
        if p is not None and p.item_id == item_id and p.audio_end_ms == audio_end_ms and self.response is None:
            self._preempt = None
            return p
        self._preempt_drop(f"the turn ended at {audio_end_ms} ms, not at its pause")
        return None

    def _preempt_drop(self, why: str) -> None:
        """Drop the preemptive answer, if any, everywhere: its requests are aborted in a task
        (in ``_discarding`` until done, which a close awaits)."""
        p, self._preempt = self._preempt, None
        if p is None:
            return
        log.info(
            "realtime session %s: preemptive answer to item %s dropped (%s); requests aborted: %s",
            self.id,
            p.item_id,
            why,
            p.request_ids(),
        )
        p.run.clock = None  # a submission still under way is no milestone of the turn, whose clock starts again
        if self.turn_clock is not None and self.turn_clock.id == p.item_id:
            self.turn_clock.mark(DROPPED, request=p.run.request_id)
        self.state.metrics.preemptive.labels("dropped").inc()
        discarding = self._spawn(self._preempt_discard(p))
        self._discarding.add(discarding)
        discarding.add_done_callback(self._discarding.discard)

    async def _preempt_discard(self, p: Preempted) -> None:
        if p.task is not None and not p.task.done():
            p.task.cancel()
            await asyncio.wait({p.task})  # its transcription's cleanup aborts that request
        failed = None if p.task is None or p.task.cancelled() else p.task.exception()
        if failed is not None:  # a bug: said here, once, or only by the garbage collector with no request id
            log.error(
                "realtime session %s: the dropped preemptive answer to item %s had failed (requests %s)",
                self.id,
                p.item_id,
                p.request_ids(),
                exc_info=failed,
            )
        await p.run.discard()

    def _preempt_release(self, p: Preempted, turn: Turn) -> None:
        """The turn ``turn`` (committed) is the one ``p`` answered: once it is submitted, its
        transcript is the turn's and the held response goes out as the session's response."""

        async def ready() -> None:
            assert p.task is not None
            try:
                # Until it is ready, or the response is cancelled (a response.cancel, a barge-in):
                # then so is it (its requests aborted), rather than holding the session's
                # handlers up while it transcribes; the turn is then transcribed as any.
                await p.run._unless_cancelled(p.task)
            except asyncio.CancelledError:  # the session closed while it was getting ready
                await p.run.discard()
                raise
            failed = None if p.task.cancelled() else p.task.exception()
            if failed is not None:  # a bug in the preemptive start must not leave the turn unanswered
                log.error(
                    "realtime session %s: the preemptive answer to item %s failed (requests %s); answered at the turn",
                    self.id,
                    p.item_id,
                    p.request_ids(),
                    exc_info=failed,
                )
            if p.transcript is not None:
                self._heard(turn, p.transcript, p.transcribe_id, at_ns=p.heard_at_ns)
                turn.transcribed.set()
            else:  # not transcribed at the pause (failed), or the pipeline hears the audio
                self._transcribe(turn)
            if p.run.tracked is not None:
                self.state.metrics.preemptive.labels("used").inc()
            else:  # not submitted: run() submits it now, as without a preemptive start
                log.info(
                    "realtime session %s: preemptive answer to item %s was not ready (requests %s): answered at the turn",
                    self.id,
                    p.item_id,
                    p.request_ids(),
                )
                self.state.metrics.preemptive.labels("dropped").inc()

        self._respond(p.run, lambda: p.build(self.conversation.turns), ready)
