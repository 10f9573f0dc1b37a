"""One realtime session over any transport: the shell around the turn-taking core.

Everything that happens to the session comes in here, one at a time, in the order it
happened: the client's events (:meth:`RealtimeSession.handle`, in the order they arrived),
the microphone's audio (:meth:`RealtimeSession.feed`, whose turn detection says speech
started, paused, resumed or stopped), and the completions of the work the session started
(a response done, its audio heard to the end). Each becomes an event of the pure core
(:class:`~omnictl.serving.realtime.turn_taking.TurnTaking`), which says what to do; the
shell does it (:meth:`RealtimeSession._run`) with its parts, each handed only what it calls:

- :class:`~.listening.Listener`: appends, the input buffer, turn detection, the echo hold;
- :class:`~.transcripts.Transcriber`: the user's turns transcribed, whole or while spoken;
- :class:`~.replies.Replies`: responses, and the early answer held from a pause;
- :class:`~.items.Items`: items the client creates, truncates, deletes, retrieves;
- :class:`~.configure.Configure`: ``session.update`` and the session object.

What takes long (a transcription, a response) runs in a task, so the session keeps
listening, which is what lets speech interrupt an answer (barge-in). Each handler either
does what its event asks or raises :class:`~omnictl.serving.realtime.events.EventError`,
which the transport answers with an ``error`` event; the session goes on either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, Sequence

from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime import turn_taking as tt
from omnictl.serving.realtime import vad
from omnictl.serving.realtime.echo_guard import EchoGuard
from omnictl.serving.realtime.responses import AudioOut, ResponseRun
from omnictl.serving.realtime.session.configure import Configure
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.session.items import Items
from omnictl.serving.realtime.session.listening import Listener
from omnictl.serving.realtime.session.milestones import TurnClock
from omnictl.serving.realtime.session.replies import Preempted, Replies
from omnictl.serving.realtime.session.settings import Settings
from omnictl.serving.realtime.session.transcripts import LiveTurn, Transcriber
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector
from omnictl.serving.realtime.turns import Conversation, Turn
from omnictl.serving.realtime.vad import SileroModel, TurnDetector
from omnictl.serving.state import PipelineLike, ServingState


class RealtimeSession:
    def __init__(
        self,
        state: ServingState,
        pipeline: PipelineLike,
        send: Callable[[ev.ServerEvent], None],
        model: str,
        silero: Callable[[], SileroModel],
        traceparent: str | None = None,
        intent: str | None = None,
        transport: str = "websocket",
        audio_out: AudioOut | None = None,
    ) -> None:
        self.send = send  # the client's event sink (read at each event: a transport may swap it)
        self.state, self.pipeline, self.model, self.transport = state, pipeline, model, transport
        self.audio_out = audio_out  # None: the answer's audio goes out as events
        self._silero = silero  # the VAD model (read when turn detection starts)
        conversation = Conversation(max_tokens=state.limits.max_realtime_conversation_tokens)
        self.ctx = SessionContext(
            state, pipeline, lambda: self.send, model, transport, audio_out, traceparent, conversation=conversation
        )
        self.id = self.ctx.id
        self.settings: Settings = self.ctx.settings
        self.conversation = conversation
        self.echo = EchoGuard()
        # A browser's WebRTC stack cancels its own echo: the guard is off there unless asked for.
        self.echo.enabled = transport != "webrtc"
        self.can_transcribe = self.ctx.can_transcribe
        self.settings.transcription = self.can_transcribe
        if intent == "transcription" or not self.ctx.can_answer:  # a recognizer alone only transcribes
            self.settings.type = "transcription"
        self.listener = Listener(self.ctx, self.echo, lambda: self._silero())
        self.transcriber = Transcriber(self.ctx)
        self.replies = Replies(
            self.ctx,
            self.transcriber,
            self.echo,
            lambda: self.listener.frontend.speech is not None,
            self._ended,
            lambda item_id, heard: self._run_now(self._feed(tt.EarlyAnswerReady(item_id, heard))),
        )
        self.items = Items(
            self.ctx,
            self.transcriber,
            self.replies,
            lambda: self.core.item_id,
            lambda: len(self.listener.buffer),
            self._cancel_for_item,
        )
        self.configure = Configure(self.ctx, self.echo, self._responding, self._reset_vad)
        self.core = tt.TurnTaking(self._policy(), new_id=lambda: ev.new_id("item"))
        # done generating, their audio still on the track (the core's `playing`), by response id
        self._playing_out: dict[str, ResponseRun] = {}
        self._reset_vad()

    # --- what the transports and the tests read ---------------------------------------------

    @property
    def buffer(self) -> bytearray:
        return self.listener.buffer

    @property
    def audio_ms(self) -> float:
        return self.listener.audio_ms

    @property
    def response(self) -> tuple[ResponseRun, asyncio.Task[None]] | None:
        """The response generating, and its task."""
        return self.replies.response

    @property
    def turn_clock(self) -> TurnClock | None:
        return self.ctx.turn_clock

    @property
    def _tasks(self) -> set[asyncio.Task[None]]:
        return self.ctx.tasks

    @property
    def _transcribing(self) -> dict[int, Turn]:
        return self.ctx.transcribing

    @property
    def _turns(self) -> TurnDetector | SemanticTurnDetector | None:
        return self.listener.turns

    @property
    def _live(self) -> LiveTurn | None:
        return self.transcriber.live

    @property
    def _preempt(self) -> Preempted | None:
        return self.replies.early

    def _live_pipeline(self) -> PipelineLike | None:
        return self.transcriber.live_pipeline()

    def session_object(self) -> ev.SessionObject | ev.TranscriptionSessionObject:
        return self.configure.session_object()

    def held_bytes(self) -> int:
        """What this session holds: its input buffer, the conversation's audio and text, audio being transcribed."""
        return self.ctx.held_bytes(len(self.listener.buffer))

    # --- the core ---------------------------------------------------------------------------

    def _policy(self) -> tt.Policy:
        s = self.settings
        return tt.Policy(
            detects_turns=s.vad is not None,
            create_response=s.vad is not None and s.vad.create_response,
            interrupt_response=s.vad is not None and s.vad.interrupt_response,
            answers=s.type == "realtime",
            live=self.transcriber.live_pipeline() is not None,
        )

    def _feed(self, event: tt.Event) -> list[tt.Effect]:
        self.core.policy = self._policy()  # the settings as they are now (session.update changes them)
        return self.core.handle(event)

    def _reset_vad(self) -> None:
        """Turn detection as the settings say, from a clean state; a turn open goes on (B3)."""
        self.listener.reset()
        self._run_now(self._feed(tt.Configured(self._policy(), turn_detection=True)))

    def _preempt_drop(self, why: str) -> None:
        """Drop the early answer, if one is held."""
        self._run_now(self._feed(tt.Drop(why)))

    def _responding(self) -> str | None:
        return self.replies.response[0].id if self.replies.response is not None else None

    def _run_now(self, effects: Sequence[tt.Effect]) -> None:
        """Effects that need no await: a completion's (a response done), a reset's."""
        for effect in effects:
            if isinstance(effect, tt.DropEarlyAnswer):
                self.replies.drop_early(effect.why)
            elif isinstance(effect, tt.DropTurn):
                self.transcriber.live_drop()
            elif isinstance(effect, tt.AdoptTranscript):
                self.replies.adopt_transcript(effect.item_id)
            elif isinstance(effect, tt.TranscribeTurn):
                self.replies.transcribe_released(effect.item_id)
            elif isinstance(effect, tt.StartResponse):
                self._start(ev.ResponseConfig(), None)
            else:
                raise AssertionError(f"{effect} cannot be done without waiting")

    def _start(self, config: ev.ResponseConfig, event_id: str | None) -> None:
        run = self.replies.start(config, event_id)
        self._run_now(self._feed(tt.ResponseStarted(run.id)))

    def _ended(self, run: ResponseRun, playing: bool) -> None:
        """A response's task ended (``response.done`` sent); ``playing``: its audio still plays."""
        if playing:
            self._playing_out[run.id] = run
        self._run_now(self._feed(tt.ResponseDone(run.id, playing)))

    def playout_finished(self, response_id: str) -> None:
        """The track played ``response_id``'s audio to its end: that reply has been heard."""
        self._playing_out.pop(response_id, None)
        self._run_now(self._feed(tt.PlayoutFinished(response_id)))

    async def _run(
        self, effects: list[tt.Effect], event_id: str | None = None, config: ev.ResponseConfig | None = None
    ) -> None:
        """Do what the core said, in order; an effect that fails stops the rest (its error is the client's)."""
        committed: Turn | None = None
        for effect in effects:
            if isinstance(effect, tt.OpenTurn):
                if effect.announce:
                    self.send(ev.SpeechStartedEvent(audio_start_ms=effect.audio_ms, item_id=effect.item_id))
                # transcribed from now on, the prefix padding first
                self.transcriber.live_open(effect.item_id, bytes(self.listener.buffer))
            elif isinstance(effect, tt.DropTurn):
                self.transcriber.live_drop()
            elif isinstance(effect, tt.Interrupt):
                if self.replies.response is not None:  # barge-in
                    self.replies.stop_playing()
                    await self.replies.response[0].cancel("turn_detected")
            elif isinstance(effect, tt.ClearPlayout):
                played = self._playing_out.pop(effect.response_id, None)
                if played is not None:
                    self.replies.cut_to_heard(played)
            elif isinstance(effect, tt.StartEarlyAnswer):
                self.replies.start_early(effect.item_id, bytes(self.listener.buffer))
            elif isinstance(effect, tt.DropEarlyAnswer):
                self.replies.drop_early(effect.why)
            elif isinstance(effect, tt.EndSpeech):
                self.ctx.turn(effect.item_id).mark("speech_stopped")
                self.send(ev.SpeechStoppedEvent(audio_end_ms=effect.audio_ms, item_id=effect.item_id))
            elif isinstance(effect, tt.CommitTurn):
                try:
                    committed = self._commit(effect.item_id, event_id, effect.transcribe)
                except ev.EventError:
                    self._run_now(self._feed(tt.CommitFailed(effect.item_id)))
                    raise
                if effect.end_detector_turn:
                    self.listener.end_detector_turn()
            elif isinstance(effect, tt.ReleaseEarlyAnswer):
                assert committed is not None and committed.id == effect.item_id
                run = self.replies.release(committed)  # the answer started at the pause goes out now
                self._run_now(self._feed(tt.ResponseStarted(run.id)))
            elif isinstance(effect, tt.StartResponse):
                self._start(config or ev.ResponseConfig(), event_id if config is not None else None)
            elif isinstance(effect, tt.CancelResponse):
                await self.replies.cancel(effect.reason)
            elif isinstance(effect, tt.ClearInput):
                self.listener.buffer.clear()
                self.transcriber.live_drop()
                self._reset_vad()
            elif isinstance(effect, tt.Refuse):
                raise ev.Refusal(event_id)(effect.message, effect.code, effect.param)
            elif isinstance(effect, tt.AwaitDrops):
                if self.replies.discarding:  # this drop's and any earlier one's not done yet
                    await asyncio.shield(asyncio.gather(*self.replies.discarding))

    def _commit(self, item_id: str, event_id: str | None, transcribe: bool) -> Turn:
        """The buffer as the user item ``item_id``, told to the client; transcribed now unless
        ``transcribe`` is False (the early answer heard it already)."""
        samples = self.listener.take(event_id)
        previous = self.conversation.last_id()
        turn = self.conversation.user_audio(samples, item_id)
        self.ctx.turn(item_id).mark("turn_confirmed")
        self.send(ev.Committed(item_id=item_id, previous_item_id=previous))
        self.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
        if transcribe:
            self.transcriber.transcribe(turn)
        return turn

    # --- the inbox --------------------------------------------------------------------------

    async def handle(self, event: ev.ClientEvent) -> None:
        if not isinstance(event, (ev.InputAudioBufferAppend, ev.ConversationItemRetrieve)):
            # The client acts (commits, clears, creates, updates): an answer started at a pause
            # would answer a conversation that is no longer the one it heard.
            await self._run(self._feed(tt.ClientActed(event.__struct_config__.tag)))  # type: ignore[arg-type]  # every client event has its tag
        handlers = {
            ev.SessionUpdate: self.session_update,
            ev.InputAudioBufferAppend: self.append,
            ev.InputAudioBufferCommit: self.commit,
            ev.InputAudioBufferClear: self.clear,
            ev.ConversationItemCreate: self.item_create,
            ev.ConversationItemTruncate: self.item_truncate,
            ev.ConversationItemDelete: self.item_delete,
            ev.ConversationItemRetrieve: self.item_retrieve,
            ev.ResponseCreate: self.response_create,
            ev.ResponseCancel: self.response_cancel,
            ev.OutputAudioBufferClear: self.output_audio_clear,
        }
        await handlers[type(event)](event)  # type: ignore[operator]  # the handler table maps each event type to the handler taking it

    async def session_update(self, event: ev.SessionUpdate) -> None:
        await self.configure.session_update(event)

    async def item_create(self, event: ev.ConversationItemCreate) -> None:
        await self.items.item_create(event)

    async def item_truncate(self, event: ev.ConversationItemTruncate) -> None:
        await self.items.item_truncate(event)

    async def item_delete(self, event: ev.ConversationItemDelete) -> None:
        await self.items.item_delete(event)

    async def item_retrieve(self, event: ev.ConversationItemRetrieve) -> None:
        await self.items.item_retrieve(event)

    async def append(self, event: ev.InputAudioBufferAppend) -> None:
        raw = self.listener.decode(event)
        if raw:
            await self.feed(raw, event.event_id)

    async def feed(self, raw: bytes, event_id: str | None = None) -> None:
        """pcm16 at 24 kHz into the input buffer and the turn detection: an append's audio, or
        a WebRTC microphone track's (which comes in real time, so it is not rate-limited)."""
        self.listener.take_in(raw, event_id)
        if self.transcriber.live is not None:
            self.transcriber.live_audio(raw)
        elif self.settings.vad is None:  # no turn detection: the turn opens with its first audio
            await self._run(self._feed(tt.AudioIn()))
        detected = await self.listener.detect(raw)
        if detected is None:
            return
        turns, found = detected
        for heard in found:
            if isinstance(heard, vad.SpeechStarted) and self.echo.playing():
                self.listener.hold(heard.audio_start_ms)  # echo? judged once enough is heard
            elif isinstance(heard, vad.SpeechStarted):
                await self._run(self._feed(tt.SpeechStarted(heard.audio_start_ms)))
            elif isinstance(heard, vad.SpeechPaused):
                paused = tt.SpeechPaused(heard.audio_end_ms, self.listener.buffered_ms)
                await self._run(self._feed(paused))
            elif isinstance(heard, vad.SpeechResumed):
                await self._run(self._feed(tt.SpeechResumed(int(self.listener.audio_ms))))
            else:
                if self.listener.held_start is not None:
                    start = await self.listener.echo_judged(turns)
                    if start is None:
                        continue  # the answer's own echo: no turn
                    await self._run(self._feed(tt.SpeechStarted(start)))
                await self._run(self._feed(tt.SpeechStopped(heard.audio_end_ms)))
        if self.listener.judge_due():
            start = await self.listener.echo_judged(turns)
            if start is not None:
                await self._run(self._feed(tt.SpeechStarted(start)))
        if self.core.listening is tt.Listening.IDLE:  # between turns: only what prefix padding may need
            self.listener.trim()

    async def commit(self, event: ev.InputAudioBufferCommit) -> None:
        await self._run(self._feed(tt.Commit()), event.event_id)

    async def clear(self, event: ev.InputAudioBufferClear) -> None:
        await self._run(self._feed(tt.Clear()), event.event_id)
        self.send(ev.Cleared())

    async def response_create(self, event: ev.ResponseCreate) -> None:
        await self._run(self._feed(tt.ResponseCreate()), event.event_id, event.response)

    async def response_cancel(self, event: ev.ResponseCancel) -> None:
        await self._run(self._feed(tt.ResponseCancel(event.response_id or None)), event.event_id)

    async def _cancel_for_item(self, response_id: str) -> None:
        """The client truncated the answer in progress: no more of it is wanted."""
        effects = self._feed(tt.ResponseCancel(response_id))
        # Refused only when it is cancelling already: then its last events are awaited all the same.
        await self._run([e for e in effects if not isinstance(e, tt.Refuse)])
        await self.replies.cancel("client_cancelled")

    async def output_audio_clear(self, event: ev.OutputAudioBufferClear) -> None:
        """Over a WebSocket the client holds the audio it was sent: clearing it here means no more
        of the answer's audio comes, so the response in progress is cancelled. Over WebRTC the
        server holds it: the track drops it (``output_audio_buffer.cleared``), and a response
        still in progress is cancelled too."""
        refuse = ev.Refusal(event.event_id)
        # The core's view changes (a reply cancelling, or no longer playing); how the audio is
        # cleared, and what is said of it, is the transport's: the track, or the client's buffer.
        self._feed(tt.OutputAudioClear())
        response = self.replies.response
        if self.audio_out is not None:
            cancelled = None
            self._playing_out.clear()
            if response is not None:
                run, task = response
                await run.cancel("client_cancelled")
                await asyncio.shield(task)
                cancelled = run.id
            if not self.audio_out.clear():  # the track held none of it (it tells the client when it did)
                if cancelled is None:
                    raise refuse("output_audio_buffer.clear: no audio is playing", "response_cancel_not_active")
                self.send(ev.OutputAudioBufferCleared(response_id=cancelled))  # its audio will not play
            self.echo.stop()
            return
        if response is None:
            raise refuse("output_audio_buffer.clear: no response is sending audio", "response_cancel_not_active")
        run = response[0]
        await self.replies.cancel("client_cancelled")
        self.send(ev.OutputAudioBufferCleared(response_id=run.id))

    async def close(self) -> None:
        """The socket closed: cancel the response, abort every pipeline request of this session."""
        for effect in self._feed(tt.Closed()):
            if isinstance(effect, tt.DropEarlyAnswer):
                self.replies.drop_early(effect.why)
            elif isinstance(effect, tt.AwaitDrops) and self.replies.discarding:
                # before the tasks are cancelled: they abort the dropped answers' requests
                await asyncio.shield(asyncio.gather(*self.replies.discarding))
        if self.replies.response is not None:
            await self.replies.response[0].cancel("client_cancelled")
        if self.audio_out is not None:
            self.audio_out.clear()
        self._playing_out.clear()  # nothing of it plays any more
        for task in list(self.ctx.tasks):
            task.cancel()
        for task in list(self.ctx.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.replies.response is not None:
            # Its task was cancelled before it ran a step, so none of its own cleanup ran: a
            # released early answer's held request is still tracked (and may be submitting).
            await self.replies.response[0].discard()
