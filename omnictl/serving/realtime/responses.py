"""One response: the conversation through the pipeline, streamed back as response events.

A response is one pipeline request. Its text terminal's deltas become
``response.output_text.delta`` (when the session asked for text), its audio terminal's
chunks ``response.output_audio.delta`` (24 kHz pcm16) with the words they say as
``response.output_audio_transcript.delta``. Text is always requested from the pipeline
when the topology has it: it costs nothing next to speech, gives the usage counts, and
is what the conversation remembers of an answer. :meth:`ResponseRun.cancel` aborts the
pipeline request everywhere; from that moment no delta of this response is sent, and
``response.done`` says ``cancelled``: its item is ``incomplete`` and holds only what was
sent (for a spoken answer, the words of the audio sent).

A barge-in (speech detected while answering) cuts a spoken answer to the server's own
estimate of what was heard, :meth:`ResponseRun.played_ms`: a client plays each delta as it
arrives, in real time, so what it has played is the time since the first audio delta went
out (at most the audio sent); the rest sat unplayed in its buffer. The cut is announced
with ``conversation.item.truncated``; a client that knows better sends its own
``conversation.item.truncate``, which replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence

from omnictl.exceptions import InvalidRequest, Overloaded, PipelineDead
from omnictl.inputs import ChatRequest
from omnictl.outputs import AUDIO, TEXT, AudioChunk, AudioResult, TextResult, transcript_delta
from omnictl.outputs import TextDelta as PipelineTextDelta
from omnictl.request import RequestEventKind
from omnictl.serving.common.echo import clip
from omnictl.serving.common.intake import underrun_refusal
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import PCM, AudioCodec
from omnictl.serving.realtime.turns import Conversation, Segment, Turn
from omnictl.serving.speech.encode import AudioStreamEncoder, b64
from omnictl.serving.state import PipelineLike, ServingState

if TYPE_CHECKING:  # the session package imports this module: only the type, no import cycle
    from omnictl.serving.realtime.session.milestones import TurnClock

Send = Callable[[ev.ServerEvent], None]
log = logging.getLogger("omnictl.serving.realtime")


class AudioOut(Protocol):
    """Where a transport that plays the answer itself takes its audio (WebRTC's outbound track):
    then no ``response.output_audio.delta`` is sent, and the transport says when playing starts,
    stops, and is cleared (``output_audio_buffer.started`` / ``.stopped`` / ``.cleared``)."""

    def play(self, response_id: str, pcm: bytes) -> None:
        """Queue pcm16 at 24 kHz of ``response_id`` to play after what is queued."""

    def finish(self, response_id: str) -> bool | None:
        """No more audio comes for ``response_id``: once what is queued is played, it has stopped.
        True if some of it is still to play (the reply is not heard yet)."""

    def clear(self) -> bool:
        """Drop what is queued and stop playing now; True if anything was playing."""

    def played_ms(self, response_id: str) -> float:
        """How much of ``response_id``'s audio has been played (what the listener heard)."""


@dataclass
class ResponseRun:
    id: str
    modalities: list[str]  # what the client asked for: text and/or audio
    send: Send
    state: ServingState
    pipeline: PipelineLike
    traceparent: str | None = None  # the session's caller span (W3C), for the exported trace
    codec: AudioCodec = PCM  # the session's output audio format
    on_audio: Callable[[bytes], None] | None = None  # told each audio delta sent (pcm16, 24 kHz): the echo guard
    audio_out: AudioOut | None = None  # WebRTC's track: the audio goes there, not out as events
    clock: TurnClock | None = None  # the turn this response answers: its milestones
    max_output_tokens: int | Literal["inf"] = "inf"  # its limit, as its events say it
    metadata: dict[str, str] | None = None  # the client's (response.create), echoed on its events
    cancel_reason: str | None = None
    request_id: str | None = None
    tracked: Tracked | None = None
    turn: Turn | None = None
    usage: ev.Usage = field(default_factory=ev.Usage)
    _finished: bool = False
    _cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    _sent_text: str = ""  # text deltas sent
    _first_audio_at: float | None = None  # monotonic time the first audio delta was sent
    _heard_ms: float | None = None  # set on barge-in: the estimate of what the client played

    def played_ms(self) -> float:
        """What a client playing each delta as it arrives, in real time, has played by now."""
        if self._first_audio_at is None or self.turn is None:
            return 0.0
        return min(self.turn.audio_ms, (time.monotonic() - self._first_audio_at) * 1000)

    def _pipeline_modalities(self) -> list[str]:
        produces = set(self.pipeline.topology.terminals.values())
        wanted = {TEXT} | ({AUDIO} if AUDIO in self.modalities else set())
        return sorted(wanted & produces) or sorted({TEXT, AUDIO} & produces)

    def response(self, status: str, details: ev.StatusDetails | None = None) -> ev.Response:
        output = [self.turn.item()] if self.turn is not None else []
        return ev.Response(
            id=self.id,
            status=status,  # type: ignore[arg-type]  # the protocol's statuses: callers pass those literals
            output_modalities=self.modalities,
            output=output,
            status_details=details,
            usage=self.usage if status != "in_progress" else None,
            max_output_tokens=self.max_output_tokens,
            metadata=self.metadata,
        )

    async def cancel(self, reason: str) -> None:
        """Stop this response now: no delta after this call; the pipeline drops the request."""
        if self.cancel_reason is not None or self._finished:
            return
        self.cancel_reason = reason
        if reason == "turn_detected":
            # Over WebRTC the track says what it played (an answer may have waited behind
            # another's audio); else the estimate of a client playing each delta as it came.
            self._heard_ms = self.audio_out.played_ms(self.id) if self.audio_out is not None else self.played_ms()
        self._cancelled.set()
        if self.request_id is not None:
            await self.pipeline.abort(self.request_id)

    async def run(self, conversation: Conversation, build: Callable[[], ChatRequest]) -> None:
        """Send ``response.created``, wait for transcripts, stream the answer, send ``response.done``."""
        self.send(ev.ResponseCreated(response=self.response("in_progress")))
        if self.tracked is not None:  # held since :meth:`prepare`: the client asks for it now
            self.tracked.arrived_now()
        try:
            if self.tracked is None:  # not submitted ahead by :meth:`prepare`
                await self._unless_cancelled(conversation.transcripts())
                if self.cancel_reason is not None:
                    return self._done("cancelled")
                refused = self._refusal()
                if refused is not None:
                    why, told = refused
                    if told is not None:
                        self.send(ev.error_event(told))
                    return self._done("failed", why)
                await self._submit(build())
            if self.cancel_reason is not None:  # cancelled while submitting (or while held)
                await self.pipeline.abort(self.request_id or "")
                return self._done("cancelled")
            previous = conversation.last_id()  # where the answer goes: a client places it after that item
            self.turn = conversation.text("assistant", "")
            self.turn.complete, self.turn.spoken = False, AUDIO in self.modalities
            self.send(ev.ItemAdded(item=self.turn.item(), previous_item_id=previous))
            self.send(ev.OutputItemAdded(response_id=self.id, output_index=0, item=self.turn.item()))
            self.send(ev.ContentPartAdded(response_id=self.id, item_id=self.turn.id, part=self._part()))
            outcome, error = await self._stream()
            self._done(outcome, error)
        except Overloaded as exc:  # admission control: the client hears why and when to retry
            self.send(
                ev.error_event(
                    ev.EventError(f"{exc} (retry after {exc.retry_after} s)", "overloaded", kind="rate_limit_error")
                )
            )
            self._done("failed", f"the server is overloaded: {exc}")
        except (InvalidRequest, PipelineDead) as exc:
            self._done("failed", f"the pipeline refused the response: {clip(str(exc))}")
        except Exception as exc:
            log.exception("realtime response %s failed before it finished", self.id)
            self._done("failed", f"the server could not run this response ({type(exc).__name__})")
        finally:
            if self.tracked is not None and self.tracked.outcome is None:  # the task itself was cancelled
                await self.pipeline.abort(self.tracked.request.id)
                self.tracked.finish("aborted")

    def _refusal(self) -> tuple[str, ev.EventError | None] | None:
        """Why the server would not take this response now, and the ``error`` event that tells
        the client (if one does), or None. As admission refuses HTTP requests: never sent to a
        stage process that is not responding, nor past what playback continuity admits (429)."""
        if self.state.unresponsive:
            names = ", ".join(repr(p) for p in self.state.unresponsive)
            return f"stage process {names} is not responding (see /health); retry later", None
        refusal = underrun_refusal(self.state, self.modalities)
        if refusal is None:
            return None
        refused = f"{refusal.message} (retry after {refusal.retry_after_s} s)"
        return refused, ev.EventError(refused, "audio_underrun", kind="rate_limit_error")

    async def prepare(
        self, conversation: Conversation, turns: Sequence[Turn], build: Callable[[], ChatRequest]
    ) -> bool:
        """A preemptive answer's start: the pipeline request submitted before the turn is
        confirmed, with nothing sent to the client and nothing added to the conversation.
        :meth:`run` then sends it as any response, from ``response.created`` on, reading the
        request's events that waited meanwhile in its stream. False when it is not submitted
        (cancelled, or the server would refuse it now): :meth:`run` then submits as it does
        without a preemptive start, and says why if it fails. ``turns``: the conversation's
        items it answers (their transcripts are awaited; the turn it answers is committed
        meanwhile, and waits for this)."""
        await self._unless_cancelled(conversation.transcripts(turns))
        if self.cancel_reason is not None or self._refusal() is not None:
            return False
        try:
            await self._submit(build())
        except (Overloaded, InvalidRequest, PipelineDead) as exc:
            log.info("realtime response %s: not submitted ahead of its turn (%s); it will be at the turn", self.id, exc)
            self.request_id = None
            return False
        return True

    async def discard(self) -> None:
        """A preemptive answer dropped before :meth:`run`: its pipeline request aborted everywhere,
        nothing sent. Whatever :meth:`prepare` was doing is cancelled by the caller first."""
        self._finished = True  # never runs: nothing of it is sent
        if self.request_id is not None:
            await self.pipeline.abort(self.request_id)
        if self.tracked is not None and self.tracked.outcome is None:
            self.tracked.finish("aborted")

    async def _unless_cancelled(self, work: Any) -> None:
        """Wait for ``work`` (a coroutine), or stop waiting when the response is cancelled."""
        waiting = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._cancelled.wait())
        try:
            await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the caller is cancelled (a preemptive answer dropped): else both wait on, forever
            for task in (waiting, stop):
                task.cancel()
        await asyncio.gather(waiting, stop, return_exceptions=True)

    async def _submit(self, request: ChatRequest) -> None:
        self.request_id = ev.new_id("resp_req")
        at = time.monotonic_ns()  # the submission's start: its first events may come in before it returns
        submitted = await self.pipeline.submit(
            request, self._pipeline_modalities(), request_id=self.request_id, traceparent=self.traceparent
        )
        if self.clock is not None:
            self.clock.mark("response_started", request=self.request_id, at_ns=at)
        self.state.metrics.in_flight.inc()
        self.tracked = Tracked(submitted, self.state.metrics, self.state.active, self.state.model_name, "pcm16")
        if "audio" in self.modalities:
            self.tracked.plays("/v1/realtime")
            self.tracked.profiler = self.state.profiler
        self.state.active[submitted.id] = self.tracked

    def _part(self) -> ev.Content:
        return (
            ev.Content(type="output_audio", transcript="")
            if AUDIO in self.modalities
            else ev.Content(type="output_text", text="")
        )

    async def _stream(self) -> tuple[str, str | None]:
        assert self.tracked is not None and self.turn is not None
        tracked, turn = self.tracked, self.turn
        encoder = AudioStreamEncoder("pcm16")
        g711 = self.codec.encoder()  # one resampler for the answer's deltas (G.711), not one per delta
        streamed_audio = aborted = False
        spoken = ""  # the audio transcript deltas sent, joined
        async for event in tracked.request.events():
            if self.cancel_reason is not None or event.kind is RequestEventKind.ABORTED:
                aborted = True  # nothing more of this response goes out
                break
            if event.kind is RequestEventKind.ERROR:
                tracked.finish("failed")
                log.warning(
                    "realtime response %s (request %s) failed in stage %r: %s",
                    self.id,
                    tracked.request.id,
                    event.stage,
                    event.error,
                )
                return "failed", f"stage {event.stage!r}: {event.error}"
            data: Any = event.data
            if isinstance(data, TextResult):
                self.usage = ev.Usage(
                    data.prompt_tokens, data.completion_tokens, data.prompt_tokens + data.completion_tokens
                )
                rest = data.text[len(turn.text or "") :] if data.text.startswith(turn.text or "") else ""
                if rest:
                    self._text(rest, event.at_ns)
                turn.text = data.text
            elif isinstance(data, PipelineTextDelta):
                self._text(data.text, event.at_ns)
            elif isinstance(data, AudioChunk) and AUDIO in self.modalities:
                if isinstance(data, AudioResult) and streamed_audio:
                    continue
                streamed_audio = streamed_audio or event.kind is RequestEventKind.STREAM
                if self.clock is not None:  # when it came out of the pipeline (a held answer's, before its release)
                    self.clock.mark("first_clause", request=tracked.request.id, at_ns=event.at_ns)
                pcm = encoder.encode(data.samples, data.sample_rate)  # pcm16 at 24 kHz
                start = turn.audio_ms
                turn.segments.append(Segment(start, start + len(pcm) / 48, data.transcript.strip()))  # 48 bytes/ms
                if pcm:  # a clause with nothing to pronounce ("...", an emoji) sends no audio; its words still go
                    if self.audio_out is not None:
                        self.audio_out.play(self.id, pcm)
                    else:
                        self.send(ev.AudioDelta(response_id=self.id, item_id=turn.id, delta=b64(g711.encode(pcm))))
                    tracked.saw(data)  # handed to the session's sender: the listener's clock counts from here
                    if self.clock is not None:
                        self.clock.mark("first_audio_sent", request=tracked.request.id)
                    if self._first_audio_at is None:
                        self._first_audio_at = time.monotonic()
                    if self.on_audio is not None:
                        self.on_audio(pcm)
                words = transcript_delta(spoken, data.transcript)
                spoken += words
                self.send(ev.AudioTranscriptDelta(response_id=self.id, item_id=turn.id, delta=words))
        if aborted or self.cancel_reason is not None:
            tracked.finish("aborted")
            return "cancelled", None
        tracked.finish("completed")
        if AUDIO in self.modalities:
            turn.text = turn.text or spoken
        return "completed", None

    def _text(self, delta: str, at_ns: int) -> None:
        """``delta`` of the answer's text, which came out of the pipeline at ``at_ns``."""
        assert self.turn is not None and self.tracked is not None
        self.turn.text = (self.turn.text or "") + delta
        if delta:
            self.tracked.saw_text()
            if self.clock is not None:
                self.clock.mark("first_token", request=self.tracked.request.id, at_ns=at_ns)
        if TEXT in self.modalities and delta:
            self._sent_text += delta
            self.send(ev.TextDelta(response_id=self.id, item_id=self.turn.id, delta=delta))

    def _done(self, outcome: str, error: str | None = None) -> None:
        """End the response: its item's closing events, then ``response.done``, which is sent
        whatever fails before it (then as ``failed``, saying why): a client waits for it."""
        if self._finished:
            return
        self._finished = True
        try:
            estimated = self._close_item(outcome)
        except Exception as exc:
            log.exception("realtime response %s (request %s): closing its item failed", self.id, self.request_id)
            outcome, error = "failed", f"the server could not finish this response ({type(exc).__name__})"
            estimated = False
        turn = self.turn
        if estimated and turn is not None and turn.truncated_ms is not None:
            self.send(ev.ItemTruncated(item_id=turn.id, content_index=0, audio_end_ms=turn.truncated_ms))
        details = None
        if outcome == "cancelled":
            details = ev.StatusDetails(type="cancelled", reason=self.cancel_reason or "client_cancelled")
        elif outcome == "failed":
            details = ev.StatusDetails(
                type="failed", error={"type": "server_error", "code": "stage_failed", "message": error or ""}
            )
        self.send(ev.ResponseDone(response=self.response(outcome, details)))

    def _close_item(self, outcome: str) -> bool:
        """The answer's item, its part and content done; True if its audio was cut to the estimate of what was heard."""
        turn = self.turn
        estimated = False
        if turn is not None:
            turn.complete = True
            if outcome != "completed":
                turn.incomplete = True
                if not turn.spoken:
                    turn.text = self._sent_text
                elif turn.truncated_ms is None and self._heard_ms is not None:
                    turn.truncate(int(self._heard_ms))
                    estimated = True
                elif turn.truncated_ms is None:  # cancelled by the client: what was sent is its to cut
                    turn.text = turn.spoken_text()
            spoken = turn.text or ""
            if TEXT in self.modalities:
                self.send(ev.TextDone(response_id=self.id, item_id=turn.id, text=self._sent_text))
            if AUDIO in self.modalities:
                self.send(ev.AudioDone(response_id=self.id, item_id=turn.id))
                self.send(ev.AudioTranscriptDone(response_id=self.id, item_id=turn.id, transcript=spoken))
            part = (
                ev.Content(type="output_audio", transcript=spoken)
                if AUDIO in self.modalities
                else ev.Content(type="output_text", text=spoken)
            )
            self.send(ev.ContentPartDone(response_id=self.id, item_id=turn.id, part=part))
            item = turn.item()
            self.send(ev.OutputItemDone(response_id=self.id, output_index=0, item=item))
            self.send(ev.ItemDone(item=item))
        return estimated
