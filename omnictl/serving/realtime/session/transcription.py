"""The transcription of the user's spoken turns, by the topology's own speech recognition
(its ``transcript`` terminal), as soon as each is committed: told as
``conversation.item.input_audio_transcription.delta`` / ``.completed``. Once transcribed, a
turn keeps only its transcript; a failed transcription is an ``error`` event and leaves the
audio for the response to hear."""

from __future__ import annotations

import logging

import numpy as np

from omnictl.exceptions import InvalidRequest, Overloaded, PipelineDead
from omnictl.inputs import PCM16_RATE, AudioPart, ChatMessage, ChatRequest
from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.request import RequestEventKind
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session.core import SessionCore
from omnictl.serving.realtime.turns import Turn

log = logging.getLogger("omnictl.serving.realtime")


class Transcription(SessionCore):
    def _transcribe(self, turn: Turn) -> None:
        """What the user said, by the topology's own speech recognition, as soon as it is committed."""
        if not self.can_transcribe:
            turn.transcribed.set()  # it goes to the pipeline as audio
            return
        if self._live_commit(turn):
            return  # transcribed while spoken (:mod:`.live`): its input ends now
        self._transcribing[id(turn)] = turn
        self._spawn(self._transcription(turn))

    async def _transcription(self, turn: Turn) -> None:
        assert turn.audio is not None
        request_id = ev.new_id("transcribe")
        try:
            heard, error = await self._recognise(turn.audio, turn.id, request_id)
            if turn.deleted:  # by the client meanwhile: nothing more is said of it
                return
            if heard is None and error is None:  # ended without words: the item is done as it is
                self.send(ev.ItemDone(item=turn.item()))
            elif heard is None:
                self.send(
                    ev.error_event(
                        ev.EventError(
                            f"transcribing item {turn.id} failed: {error}", "transcription_failed", kind="server_error"
                        )
                    )
                )
            else:
                self._heard(turn, heard, request_id)
        finally:
            self._transcribing.pop(id(turn), None)
            turn.transcribed.set()  # a failed transcription leaves the audio for the response to hear

    async def _recognise(
        self, audio: np.ndarray, item_id: str, request_id: str
    ) -> tuple[Transcript | None, str | None]:
        """What ``audio`` (the user item ``item_id``'s, pcm float at 24 kHz) says, by the
        topology's speech recognition, as request ``request_id``: (the transcript, None), (None,
        None) if it heard no words, or (None, why not), the failure logged. Nothing is sent to the client: a committed
        turn's transcription announces it (:meth:`_heard`), a preemptive answer's waits for
        the turn to be confirmed. Cancelled, the request is aborted everywhere."""
        request = ChatRequest(
            messages=(
                ChatMessage(
                    role="user", parts=(AudioPart(samples=audio, sample_rate=PCM16_RATE, field=f"item {item_id}"),)
                ),
            ),
            language=self.settings.language,  # the session's transcription.language
        )
        tracked: Tracked | None = None
        try:
            submitted = await self.pipeline.submit(
                request, [TRANSCRIPT], request_id=request_id, traceparent=self.traceparent
            )
            self.state.metrics.in_flight.inc()
            tracked = Tracked(submitted, self.state.metrics, self.state.active, self.model)
            self.state.active[submitted.id] = tracked
            heard: Transcript | None = None
            async for event in submitted.events():
                if event.kind is RequestEventKind.RESULT and isinstance(event.data, Transcript):
                    heard = event.data
                elif event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
                    tracked.finish("failed" if event.kind is RequestEventKind.ERROR else "aborted")
                    log.warning(
                        "realtime session %s: transcribing item %s (request %s) failed: %s",
                        self.id,
                        item_id,
                        submitted.id,
                        event.error,
                    )
                    return None, str(event.error)
            tracked.finish("completed")
            return heard, None
        except (InvalidRequest, Overloaded, PipelineDead) as exc:
            log.warning(
                "realtime session %s: transcribing item %s (request %s) failed: %s", self.id, item_id, request_id, exc
            )
            return None, str(exc)
        finally:
            if tracked is not None and tracked.outcome is None:  # cancelled: the session closed, or an answer dropped
                await self.pipeline.abort(tracked.request.id)
                tracked.finish("aborted")

    def _heard(self, turn: Turn, heard: Transcript, request_id: str | None, at_ns: int | None = None) -> None:
        """A committed turn's transcript: it becomes the turn's text (what later responses hear),
        is told to the client, and the item is done. ``at_ns``: when it was heard, if before
        now (a preemptive answer's, heard at the pause)."""
        if self.turn_clock is not None and self.turn_clock.id == turn.id:
            self.turn_clock.mark("transcript_final", request=request_id, at_ns=at_ns)
        turn.text = heard.text
        turn.release_audio()  # the transcript is what later responses hear
        if turn.deleted:  # by the client meanwhile (a preemptive answer's turn): nothing more is said of it
            return
        self.conversation.trim()  # a transcript may weigh less (or more) than its audio did
        if self.settings.transcription:
            # The recogniser gives its transcript whole: one delta, then the completed text.
            self._send_transcript(turn.id, heard)
        self.send(ev.ItemDone(item=turn.item()))
