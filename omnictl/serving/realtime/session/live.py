"""The user's turn transcribed while it is spoken (issue 39): with a live transcriber (the
server's streaming speech recognition, :attr:`ServingState.live_transcriber`: a pipeline
whose entry takes a streamed input and streams each confirmed word as a
:class:`~omnictl.outputs.Transcript` delta), the session opens one streaming-input request
per turn when speech starts (server or semantic VAD), or with the first audio after a commit
when turn detection is off, sends the microphone's audio to it as it is appended, and ends
its input when the turn is committed.

Each confirmed word goes out at once as ``conversation.item.input_audio_transcription.delta``
(while the user is still speaking); the final transcript, ``...completed``, is the deltas
joined. It is also the turn's text: the response hears it, and no second whole-utterance
decode runs after the turn ends. When the live request fails before the turn is committed,
the committed turn is transcribed whole as without a live transcriber; when it fails after,
the failure is an ``error`` event and the response hears the turn's audio."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from omnictl.exceptions import InvalidRequest, Overloaded, PipelineDead, RequestError
from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.request import RequestEventKind
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session.core import SessionCore
from omnictl.serving.realtime.turns import Turn
from omnictl.serving.state import PipelineLike

log = logging.getLogger("omnictl.serving.realtime")


@dataclass
class LiveTurn:
    """One turn's streaming transcription request, from speech start to its final transcript."""

    item_id: str  # the user item the turn becomes when committed
    chunks: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)  # pcm16 24 kHz; None: the end
    deltas: list[str] = field(default_factory=list)  # confirmed words sent so far
    turn: Turn | None = None  # set at commit
    failed: str | None = None  # why the request failed before the commit (then the turn is decoded whole)
    task: asyncio.Task[None] | None = None


class LiveTranscription(SessionCore):
    def _live_pipeline(self) -> PipelineLike | None:
        """The live transcriber, when the server has one and this session transcribes. Not for
        a session that names its language: the live transcriber decodes the one it was started
        with, so such a session's turns are transcribed whole, in the language it named."""
        return self.state.live_transcriber if self.can_transcribe and self.settings.language is None else None

    def _live_open(self, item_id: str) -> None:
        """Open the turn's streaming transcription with the buffer so far (the speech's prefix padding)."""
        if self._live is not None or self._live_pipeline() is None:
            return
        live = LiveTurn(item_id)
        if self.buffer:
            live.chunks.put_nowait(bytes(self.buffer))
        live.task = self._spawn(self._live_run(live))
        self._live = live

    def _live_audio(self, raw: bytes) -> None:
        """Audio appended during the turn, sent on to its transcription."""
        if self._live is not None and self._live.failed is None and raw:
            self._live.chunks.put_nowait(raw)

    def _live_commit(self, turn: Turn) -> bool:
        """The turn is committed: end the live input; False when there is no live transcription of it."""
        live, self._live = self._live, None
        if live is None:
            return False
        if live.failed is not None:
            return False  # failed before the commit (and said so in the log): the caller decodes it whole
        live.turn = turn
        self._transcribing[id(turn)] = turn
        live.chunks.put_nowait(None)
        return True

    def _live_drop(self) -> None:
        """The buffer was cleared: the turn's transcription is aborted everywhere."""
        live, self._live = self._live, None
        if live is not None and live.task is not None:
            live.task.cancel()  # its finally aborts the pipeline request

    async def _live_run(self, live: LiveTurn) -> None:
        pipeline = self._live_pipeline()
        assert pipeline is not None
        tracked: Tracked | None = None
        try:
            try:
                submitted = await pipeline.submit(
                    None,
                    [TRANSCRIPT],
                    request_id=ev.new_id("transcribe"),
                    traceparent=self.traceparent,
                    input_stream=True,
                )
                self.state.metrics.in_flight.inc()
                tracked = Tracked(submitted, self.state.metrics, self.state.active, self.model)
                self.state.active[submitted.id] = tracked
                reader = asyncio.ensure_future(self._live_read(live, submitted))
                try:
                    while True:
                        chunk = await live.chunks.get()
                        if chunk is None:
                            await submitted.end_input()
                            break
                        await submitted.send(chunk)
                except RequestError:
                    pass  # it ended (failed or aborted): the reader has its event and says why
                except BaseException:
                    reader.cancel()
                    raise
                heard, error = await reader
                tracked.finish("completed" if heard is not None else "failed")
            except (InvalidRequest, Overloaded, PipelineDead) as exc:
                heard, error = None, str(exc)
            self._live_done(live, heard, error)
        finally:
            if tracked is not None and tracked.outcome is None:  # cleared, or the session closed meanwhile
                await pipeline.abort(tracked.request.id)
                tracked.finish("aborted")
            if live.turn is not None:
                self._transcribing.pop(id(live.turn), None)
                live.turn.transcribed.set()  # a failed transcription leaves the audio for the response to hear

    async def _live_read(self, live: LiveTurn, submitted: Any) -> tuple[Transcript | None, str | None]:
        """The request's words as deltas as they come; (the final transcript, or None and why not)."""
        heard: Transcript | None = None
        async for event in submitted.events():
            if event.kind is RequestEventKind.STREAM and isinstance(event.data, Transcript) and event.data.text:
                live.deltas.append(event.data.text)
                if self.settings.transcription:
                    self.send(ev.TranscriptionDelta(item_id=live.item_id, content_index=0, delta=event.data.text))
            elif event.kind is RequestEventKind.RESULT and isinstance(event.data, Transcript):
                heard = event.data
            elif event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
                return None, str(event.error)
        return heard, None if heard is not None else "the live transcription ended without a transcript"

    def _live_done(self, live: LiveTurn, heard: Transcript | None, error: str | None) -> None:
        turn = live.turn
        if heard is None:
            log.warning("realtime session %s: live transcription of item %s failed: %s", self.id, live.item_id, error)
            if turn is None:
                live.failed = error or "failed"  # not committed yet: the commit decodes it whole
                return
            self.send(
                ev.error_event(
                    ev.EventError(
                        f"transcribing item {turn.id} failed: {error}", "transcription_failed", kind="server_error"
                    )
                )
            )
            return  # the response hears the turn's audio
        assert turn is not None  # a result comes only after the input ends, which the commit does
        if self.turn_clock is not None and self.turn_clock.id == turn.id:
            self.turn_clock.mark("transcript_final")
        turn.text = heard.text
        turn.release_audio()  # the transcript is what later responses hear
        if turn.deleted:  # by the client meanwhile: nothing more is said of it
            return
        self.conversation.trim()
        if self.settings.transcription:
            self._send_transcript(turn.id, heard, streamed="".join(live.deltas))
        self.send(ev.ItemDone(item=turn.item()))
