"""The user's spoken turns transcribed: whole once committed, or while spoken.

**Whole.** As soon as a turn is committed, the topology's own speech recognition (its
``transcript`` terminal) decodes it: told as ``conversation.item.input_audio_transcription.delta``
/ ``.completed``. Once transcribed, a turn keeps only its transcript; a failed transcription is
an ``error`` event and leaves the audio for the response to hear.

**While spoken** (issue 39; issue 46: by default). When the served topology listens
(:func:`~.context.listens`: the voice assistant, whose ``asr`` takes a streamed input through
its entry and streams each confirmed word as a :class:`~omnictl.outputs.Transcript` delta, on
the one Whisper that also decodes whole questions), or the server was given a separate live
transcriber (:attr:`ServingState.live_transcriber`, deprecated), the turn opens one
streaming-input request of the ``transcript`` modality when it opens (speech started, or the
first audio with turn detection off), the microphone's audio is sent to it as it is appended,
and its input ends when the turn is committed. Each confirmed
word goes out at once as a delta (while the user is still speaking); the final transcript,
``...completed``, is the deltas joined, and the turn's text: no second decode runs after the
turn ends. When the live request fails before the commit, the committed turn is decoded
whole; when it fails after, the failure is an ``error`` event and the response hears the audio.

**At a pause** (the early answer): :meth:`Transcriber.tentative` asks the live request for the
transcript so far (a ``{"tentative": True}`` chunk; the answer is a chunk whose ``task`` is
:data:`~omnictl.outputs.TENTATIVE`): the recogniser decodes only the tail after the words it
confirmed, and nothing when only silence came since its last pass. No audio is sent again.
When the turn is confirmed where it paused, that transcript is the turn's
(:meth:`Transcriber.live_heard`) and the live request is aborted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from omnictl.exceptions import InvalidRequest, Overloaded, PipelineDead, RequestError
from omnictl.inputs import PCM16_RATE, AudioPart, ChatMessage, ChatRequest
from omnictl.outputs import TENTATIVE, TRANSCRIPT, Transcript
from omnictl.request import RequestEventKind
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.turns import Turn
from omnictl.serving.state import PipelineLike

log = logging.getLogger("omnictl.serving.realtime")


@dataclass
class LiveTurn:
    """One turn's streaming transcription request, from its opening to its final transcript."""

    item_id: str  # the user item the turn becomes when committed
    # pcm16 24 kHz, or {"tentative": True} (the transcript so far is wanted); None: the end
    chunks: asyncio.Queue[bytes | dict[str, bool] | None] = field(default_factory=asyncio.Queue)
    deltas: list[str] = field(default_factory=list)  # confirmed words sent so far
    turn: Turn | None = None  # set at commit
    failed: str | None = None  # why the request failed before the commit (then the turn is decoded whole)
    task: asyncio.Task[None] | None = None
    tentative: asyncio.Future[Transcript | None] | None = None  # the transcript so far, asked for
    closed: bool = False  # its transcript came another way (the early answer's): no more deltas go out


class Transcriber:
    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.live: LiveTurn | None = None  # the turn being transcribed as it is spoken

    # --- whole ------------------------------------------------------------------------------

    def transcribe(self, turn: Turn, detached: LiveTurn | None = None, was_detached: bool = False) -> None:
        """What the user said, by the topology's own speech recognition, as soon as it is
        committed: its live transcription's input ends (the open turn's, or ``detached`` when
        ``was_detached``: its turn's, taken by :meth:`detach`), else it is decoded whole."""
        ctx = self.ctx
        if not ctx.can_transcribe:
            turn.transcribed.set()  # it goes to the pipeline as audio
            return
        if was_detached:
            if detached is not None and self.live_commit(turn, detached):
                return
        elif self.live_commit(turn):
            return  # transcribed while spoken: its input ends now
        ctx.transcribing[id(turn)] = turn
        ctx.spawn(self._transcription(turn))

    async def _transcription(self, turn: Turn) -> None:
        assert turn.audio is not None
        request_id = ev.new_id("transcribe")
        streamed: list[str] = []  # the pieces a recognizer that streams its decoding sent (Qwen3-ASR)

        def piece(text: str) -> None:
            # Told as it is decoded; the first piece loses the space a tokenizer puts before a word,
            # as the completed transcript does, so the deltas add up to it.
            text = text if streamed else text.lstrip()
            if text and not turn.deleted and self.ctx.settings.transcription:
                streamed.append(text)
                self.ctx.send(ev.TranscriptionDelta(item_id=turn.id, content_index=0, delta=text))

        try:
            heard, error = await self.recognise(turn.audio, turn.id, request_id, piece)
            if turn.deleted:  # by the client meanwhile: nothing more is said of it
                return
            if heard is None and error is None:  # ended without words: the item is done as it is
                self.ctx.send(ev.ItemDone(item=turn.item()))
            elif heard is None:
                self.ctx.send(
                    ev.error_event(
                        ev.EventError(
                            f"transcribing item {turn.id} failed: {error}", "transcription_failed", kind="server_error"
                        )
                    )
                )
            else:
                self.heard(turn, heard, request_id, streamed="".join(streamed) if streamed else None)
        finally:
            self.ctx.transcribing.pop(id(turn), None)
            turn.transcribed.set()  # a failed transcription leaves the audio for the response to hear

    async def recognise(
        self, audio: np.ndarray, item_id: str, request_id: str, piece: Callable[[str], None] | None = None
    ) -> tuple[Transcript | None, str | None]:
        """What ``audio`` (the user item ``item_id``'s, pcm float at 24 kHz) says, by the
        topology's speech recognition, as request ``request_id``: (the transcript, None), (None,
        None) if it heard no words, or (None, why not), the failure logged. Nothing is sent to
        the client: a committed turn's transcription announces it (:meth:`heard`), an early
        answer's waits for the turn to be confirmed. ``piece``: given each piece of text a
        recognizer that streams its decoding sends before its transcript (Qwen3-ASR's decoder
        does; Whisper decoding a whole turn sends none). Cancelled, the request is aborted everywhere."""
        ctx = self.ctx
        request = ChatRequest(
            messages=(
                ChatMessage(
                    role="user", parts=(AudioPart(samples=audio, sample_rate=PCM16_RATE, field=f"item {item_id}"),)
                ),
            ),
            language=ctx.settings.language,  # the session's transcription.language
        )
        tracked: Tracked | None = None
        try:
            submitted = await ctx.pipeline.submit(
                request, [TRANSCRIPT], request_id=request_id, traceparent=ctx.traceparent
            )
            ctx.state.metrics.in_flight.inc()
            tracked = Tracked(submitted, ctx.state.metrics, ctx.state.active, ctx.model)
            ctx.state.active[submitted.id] = tracked
            heard: Transcript | None = None
            async for event in submitted.events():
                if event.kind is RequestEventKind.RESULT and isinstance(event.data, Transcript):
                    heard = event.data
                elif (
                    piece is not None
                    and event.kind is RequestEventKind.STREAM
                    and isinstance(event.data, Transcript)
                    and event.data.task != TENTATIVE
                ):
                    piece(event.data.text)
                elif event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
                    tracked.finish("failed" if event.kind is RequestEventKind.ERROR else "aborted")
                    log.warning(
                        "realtime session %s: transcribing item %s (request %s) failed: %s",
                        ctx.id,
                        item_id,
                        submitted.id,
                        event.error,
                    )
                    return None, str(event.error)
            tracked.finish("completed")
            return heard, None
        except (InvalidRequest, Overloaded, PipelineDead) as exc:
            log.warning(
                "realtime session %s: transcribing item %s (request %s) failed: %s", ctx.id, item_id, request_id, exc
            )
            return None, str(exc)
        finally:
            if tracked is not None and tracked.outcome is None:  # cancelled: the session closed, or an answer dropped
                await ctx.pipeline.abort(tracked.request.id)
                tracked.finish("aborted")

    def heard(
        self,
        turn: Turn,
        heard: Transcript,
        request_id: str | None,
        at_ns: int | None = None,
        streamed: str | None = None,
    ) -> None:
        """A committed turn's transcript: it becomes the turn's text (what later responses hear),
        is told to the client, and the item is done. ``at_ns``: when it was heard, if before
        now (an early answer's, heard at the pause); ``streamed``: the deltas already sent."""
        ctx = self.ctx
        ctx.mark(turn.id, "transcript_final", request=request_id, at_ns=at_ns)
        turn.text = heard.text
        turn.release_audio()  # the transcript is what later responses hear
        if turn.deleted:  # by the client meanwhile (an early answer's turn): nothing more is said of it
            return
        ctx.conversation.trim()  # a transcript may weigh less (or more) than its audio did
        if ctx.settings.transcription:
            # Whole, the recogniser gives its transcript as one delta; then the completed text.
            ctx.send_transcript(turn.id, heard, streamed=streamed)
        ctx.send(ev.ItemDone(item=turn.item()))

    # --- while spoken -----------------------------------------------------------------------

    def live_pipeline(self) -> PipelineLike | None:
        """The live transcriber, when the server has one and this session transcribes. Not for
        a session that names its language: the live transcriber decodes the one it was started
        with, so such a session's turns are transcribed whole, in the language it named."""
        ctx = self.ctx
        if not ctx.can_transcribe or ctx.settings.language is not None:
            return None
        if ctx.state.live_transcriber is not None:  # a separate one (--live-transcriber, deprecated)
            return ctx.state.live_transcriber
        return ctx.pipeline if ctx.listens else None

    def live_open(self, item_id: str, prefix: bytes) -> None:
        """Open the turn's streaming transcription with ``prefix`` (the buffer so far: the speech's prefix padding)."""
        if self.live is not None or self.live_pipeline() is None:
            return
        live = LiveTurn(item_id)
        if prefix:
            live.chunks.put_nowait(prefix)
        live.task = self.ctx.spawn(self._live_run(live))
        self.live = live

    def live_audio(self, raw: bytes) -> None:
        """Audio appended during the turn, sent on to its transcription."""
        if self.live is not None and self.live.failed is None and raw:
            self.live.chunks.put_nowait(raw)

    def detach(self) -> LiveTurn | None:
        """The open turn's live transcription, no longer the session's (its turn was committed;
        the next turn opens its own), for the caller to end (:meth:`live_commit`, :meth:`live_heard`)."""
        live, self.live = self.live, None
        return live

    async def tentative(self, live: LiveTurn) -> Transcript | None:
        """The transcript so far of ``live``'s turn (None: the request failed or ended first).
        Its recogniser decodes only the tail after the words it confirmed."""
        if live.failed is not None or live.task is None or live.task.done():
            return None
        if live.tentative is None or live.tentative.done():
            live.tentative = asyncio.get_running_loop().create_future()
            live.chunks.put_nowait({"tentative": True})
        return await asyncio.shield(live.tentative)

    def live_commit(self, turn: Turn, live: LiveTurn | None = None) -> bool:
        """The turn is committed: end the live input (the open turn's, or ``live``, detached);
        False when there is no live transcription of it."""
        if live is None:
            live, self.live = self.live, None
        if live is None:
            return False
        if live.failed is not None:
            return False  # failed before the commit (and said so in the log): the caller decodes it whole
        live.turn = turn
        self.ctx.transcribing[id(turn)] = turn
        live.chunks.put_nowait(None)
        return True

    def live_heard(self, turn: Turn, live: LiveTurn, heard: Transcript, at_ns: int | None) -> None:
        """The committed ``turn``'s transcript is the one its early answer heard at the pause
        (``live``'s tentative one): its live request is aborted, and what the deltas sent lack
        goes out with the completed transcript."""
        live.closed = True  # no delta of it after this: they would not add up to ``heard``
        streamed = "".join(live.deltas)
        if live.task is not None:
            live.task.cancel()  # its finally aborts the pipeline request
        self.heard(turn, heard, None, at_ns=at_ns, streamed=streamed)

    def live_drop(self) -> None:
        """The buffer was cleared: the turn's transcription is aborted everywhere."""
        live, self.live = self.live, None
        if live is not None and live.task is not None:
            live.task.cancel()  # its finally aborts the pipeline request

    async def _live_run(self, live: LiveTurn) -> None:
        ctx = self.ctx
        pipeline = self.live_pipeline()
        assert pipeline is not None
        tracked: Tracked | None = None
        try:
            try:
                submitted = await pipeline.submit(
                    None,
                    [TRANSCRIPT],
                    request_id=ev.new_id("transcribe"),
                    traceparent=ctx.traceparent,
                    input_stream=True,
                )
                ctx.state.metrics.in_flight.inc()
                tracked = Tracked(submitted, ctx.state.metrics, ctx.state.active, ctx.model)
                ctx.state.active[submitted.id] = tracked
                reader = asyncio.ensure_future(self._live_read(live, submitted))
                try:
                    while True:
                        chunk = await live.chunks.get()
                        if chunk is None:
                            await submitted.end_input()
                            break
                        await submitted.send(chunk)  # the audio, or a control chunk ({"tentative": True})
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
            if live.tentative is not None and not live.tentative.done():
                live.tentative.set_result(None)  # it ended before it could say: the caller decodes whole
            if live.turn is not None:
                ctx.transcribing.pop(id(live.turn), None)
                live.turn.transcribed.set()  # a failed transcription leaves the audio for the response to hear

    async def _live_read(self, live: LiveTurn, submitted: Any) -> tuple[Transcript | None, str | None]:
        """The request's words as deltas as they come; (the final transcript, or None and why not)."""
        heard: Transcript | None = None
        async for event in submitted.events():
            if (
                event.kind is RequestEventKind.STREAM
                and isinstance(event.data, Transcript)
                and event.data.task == TENTATIVE
            ):
                if live.tentative is not None and not live.tentative.done():
                    live.tentative.set_result(event.data)
            elif event.kind is RequestEventKind.STREAM and isinstance(event.data, Transcript) and event.data.text:
                if live.closed:
                    continue
                live.deltas.append(event.data.text)
                if self.ctx.settings.transcription:
                    self.ctx.send(ev.TranscriptionDelta(item_id=live.item_id, content_index=0, delta=event.data.text))
            elif event.kind is RequestEventKind.RESULT and isinstance(event.data, Transcript):
                heard = event.data
            elif event.kind in (RequestEventKind.ERROR, RequestEventKind.ABORTED):
                return None, str(event.error)
        return heard, None if heard is not None else "the live transcription ended without a transcript"

    def _live_done(self, live: LiveTurn, heard: Transcript | None, error: str | None) -> None:
        ctx = self.ctx
        turn = live.turn
        if heard is None:
            log.warning("realtime session %s: live transcription of item %s failed: %s", ctx.id, live.item_id, error)
            if turn is None:
                live.failed = error or "failed"  # not committed yet: the commit decodes it whole
                return
            ctx.send(
                ev.error_event(
                    ev.EventError(
                        f"transcribing item {turn.id} failed: {error}", "transcription_failed", kind="server_error"
                    )
                )
            )
            return  # the response hears the turn's audio
        assert turn is not None  # a result comes only after the input ends, which the commit does
        ctx.mark(turn.id, "transcript_final")
        turn.text = heard.text
        turn.release_audio()  # the transcript is what later responses hear
        if turn.deleted:  # by the client meanwhile: nothing more is said of it
            return
        ctx.conversation.trim()
        if ctx.settings.transcription:
            ctx.send_transcript(turn.id, heard, streamed="".join(live.deltas))
        ctx.send(ev.ItemDone(item=turn.item()))
