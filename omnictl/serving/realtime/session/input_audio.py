"""The session's input audio: appends (bounded in size and rate), the microphone's pieces,
turn detection (server VAD or the semantic turn model) and the echo guard's hold, commits
and clears.

Detected speech starts a turn (and interrupts an answer: barge-in); its end commits the turn
as a user item and, unless the session only transcribes, starts a response: the one started
when the speech paused, if the turn ended there (:mod:`.preempt`), else a new one. Speech heard
while the answer plays is held until the echo guard judges whether it is the answer's own
voice coming back (then dropped) or the user's."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging

from omnictl.audio import pcm16_to_float
from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import ECHO_SHARE, WINDOW_MS
from omnictl.serving.realtime.formats import PCM
from omnictl.serving.realtime.frontend import SpeechFrontEnd
from omnictl.serving.realtime.session.core import SessionCore
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector, shared_model
from omnictl.serving.realtime.turns import Turn
from omnictl.serving.realtime.vad import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnDetector,
    VadSettings,
    vad_executor,
)

log = logging.getLogger("omnictl.serving.realtime")

MIN_COMMIT_MS = 100  # a commit of less audio than this is refused, as OpenAI refuses it
PREFIX_MS = 300  # audio kept before speech starts, where the turn detection has no setting for it


class InputAudio(SessionCore):
    def _reset_vad(self) -> None:
        vad = self.settings.vad
        self._turns = None
        self._held_start = None
        if isinstance(vad, ev.ServerVad):
            self._turns = TurnDetector(VadSettings(vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms))
        elif isinstance(vad, ev.SemanticVad):
            self._turns = SemanticTurnDetector(shared_model(), vad.eagerness)
        # a new 16 kHz stream and VAD state for the new turn detection (or none)
        self._frontend.listen(None if self._turns is None else SpeechFrontEnd(self._silero(), self._turns))
        self._speech_item = None

    def _too_large(self, refuse: ev.Refusal) -> ev.EventError:
        limit = self.state.limits.max_realtime_buffer_bytes
        return refuse(
            f"the input audio buffer is limited to {limit} bytes ({limit / 2 / PCM16_RATE:.0f} s of audio); "
            "commit or clear it",
            "input_audio_buffer_too_large",
            "audio",
        )

    async def append(self, event: ev.InputAudioBufferAppend) -> None:
        codec, refuse = self.settings.input_codec, ev.Refusal(event.event_id)
        sent = len(event.audio) * 3 // 4 - event.audio[-2:].count("=")  # bytes, before decoding
        size = sent * PCM.bytes_per_second // codec.bytes_per_second  # what the buffer will hold of it
        if len(self.buffer) + size > self.state.limits.max_realtime_buffer_bytes:
            raise self._too_large(refuse)
        if not self._audio_rate.take(size / 2 / PCM16_RATE):
            limits = self.state.limits
            raise refuse(
                f"input_audio_buffer.append: audio arrives faster than this server takes it (at most "
                f"{limits.realtime_audio_speed:g}x real time after the first {limits.realtime_audio_burst_s:g} s); "
                "this append was dropped",
                "input_audio_rate_exceeded",
                "audio",
            )
        try:
            raw = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise refuse(
                f"input_audio_buffer.append: 'audio' is not valid base64 ({exc})", "invalid_base64", "audio"
            ) from exc
        if len(raw) % codec.sample_bytes:
            raise refuse(
                f"input_audio_buffer.append: pcm16 audio must hold whole 16-bit samples, got {len(raw)} bytes",
                "invalid_audio",
                "audio",
            )
        if not raw:  # no audio: nothing to hear, no turn to open (it was a traceback per event)
            return
        await self.feed(self._frontend.to_pcm16(codec, raw), event.event_id)

    async def feed(self, raw: bytes, event_id: str | None = None) -> None:
        """pcm16 at 24 kHz into the input buffer and the turn detection: an append's audio, or
        a WebRTC microphone track's (which comes in real time, so it is not rate-limited)."""
        if len(self.buffer) + len(raw) > self.state.limits.max_realtime_buffer_bytes:
            raise self._too_large(ev.Refusal(event_id))
        self.buffer += raw
        self.audio_ms += len(raw) / 2 / PCM16_RATE * 1000
        if self._live is not None:
            self._live_audio(raw)
        elif self.settings.vad is None:  # no turn detection: the turn starts with its first audio
            self._live_open(ev.new_id("item"))
        speech = self._frontend.speech
        if speech is not None and raw:
            # Resampling and Silero run in a worker thread: on the event loop, a flood of
            # appends once held /health for 41 s. This session waits for its own audio (and
            # so reads no more from its socket meanwhile); every other request goes on.
            turns = speech.turns
            heard, found = await asyncio.get_running_loop().run_in_executor(vad_executor(), speech.hear, raw)
            if speech is not self._frontend.speech:  # cleared or reconfigured meanwhile
                return
            self.echo.heard(heard)
            for turn in found:
                if isinstance(turn, SpeechStarted) and self.echo.playing():
                    self._held_start = (turn.audio_start_ms, self.audio_ms)  # echo? judged once enough is heard
                elif isinstance(turn, SpeechStarted):
                    await self._speech_started(turn.audio_start_ms)
                elif isinstance(turn, SpeechPaused):
                    self._speech_paused(turn.audio_end_ms)
                elif isinstance(turn, SpeechResumed):
                    self._preempt_drop("the user went on speaking")
                elif self._held_start is None or not await self._echo_judged(turns):
                    await self._speech_stopped(turn.audio_end_ms)
            if self._held_start is not None and self.audio_ms - self._held_start[1] >= WINDOW_MS:
                await self._echo_judged(turns)
            vad_settings = self.settings.vad
            if self._turns is not None and not self._turns.speaking and vad_settings is not None:
                padding = vad_settings.prefix_padding_ms if isinstance(vad_settings, ev.ServerVad) else PREFIX_MS
                keep = int((padding + 100) * PCM16_RATE / 1000) * 2  # what prefix padding may need
                del self.buffer[: max(0, len(self.buffer) - keep)]

    async def _echo_judged(self, turns: TurnDetector | SemanticTurnDetector) -> bool:
        """Judge the held speech: True if it was the answer's own echo (then dropped: no barge-in,
        not in the buffer); False if a voice of its own (then it starts, late by the window)."""
        assert self._held_start is not None
        start_ms, at_ms = self._held_start
        self._held_start = None
        window = int(min(WINDOW_MS * 2, max(100.0, self.audio_ms - at_ms + (at_ms - start_ms))))
        share = await asyncio.get_running_loop().run_in_executor(vad_executor(), self.echo.echo_share, window)
        if share >= ECHO_SHARE:
            log.info(
                "realtime session %s: speech at %d ms is the answer's echo (%.2f of its energy): dropped",
                self.id,
                start_ms,
                share,
            )
            turns.drop_turn()
            return True
        log.info(
            "realtime session %s: speech at %d ms over the answer is not its echo (%.2f)", self.id, start_ms, share
        )
        await self._speech_started(start_ms)
        return False

    async def _speech_started(self, audio_start_ms: int) -> None:
        self._speech_item = ev.new_id("item")
        self.send(ev.SpeechStartedEvent(audio_start_ms=audio_start_ms, item_id=self._speech_item))
        self._live_open(self._speech_item)  # transcribed from now on, the prefix padding first
        assert self.settings.vad is not None
        if self.settings.vad.interrupt_response and self.response is not None:
            self._stop_playing()
            await self.response[0].cancel("turn_detected")  # barge-in

    async def _speech_stopped(self, audio_end_ms: int) -> None:
        item_id = self._speech_item or ev.new_id("item")
        self.turn(item_id).mark("speech_stopped")
        self.send(ev.SpeechStoppedEvent(audio_end_ms=audio_end_ms, item_id=item_id))
        preempted = self._preempt_take(item_id, audio_end_ms)
        try:
            turn = self._commit(item_id, None, transcribe=preempted is None)
        except ev.EventError:
            if preempted is not None:
                self._preempt = preempted
                self._preempt_drop("the turn could not be committed")
            raise
        if preempted is not None:
            self._preempt_release(preempted, turn)  # the answer started at the pause goes out now
            return
        assert self.settings.vad is not None
        if not self.settings.vad.create_response or self.settings.type == "transcription":
            return
        if self.response is not None:
            if self.response[0].cancel_reason is None:
                return  # still answering (interrupt_response off): the next response hears this turn
            await asyncio.shield(self.response[1])  # cancelled by this speech's start: it is sending its last events
        self._start_response(ev.ResponseConfig(), None)

    async def commit(self, event: ev.InputAudioBufferCommit) -> None:
        item_id = self._live.item_id if self._live is not None else ev.new_id("item")
        speaking = self._turns is not None and self._turns.speaking and self._held_start is None
        if speaking and self._speech_item is not None:
            item_id = self._speech_item  # the turn speech_started named
        self._commit(item_id, event.event_id)
        if speaking and self._turns is not None:
            # The client ended the turn the VAD was in: its stop would commit the silence after
            # this as a second item (or, under 100 ms of it, refuse an append), under this id again.
            self._turns.drop_turn()
            self._speech_item = None

    def _commit(self, item_id: str, event_id: str | None, transcribe: bool = True) -> Turn:
        """The buffer as the user item ``item_id``, told to the client; transcribed now unless
        ``transcribe`` is False (a preemptive answer heard it already: :mod:`.preempt`)."""
        ms = len(self.buffer) / 2 / PCM16_RATE * 1000
        if ms < MIN_COMMIT_MS:
            raise ev.Refusal(event_id)(
                f"input_audio_buffer.commit: the buffer holds {ms:.0f} ms of audio; at least {MIN_COMMIT_MS} ms "
                "is needed",
                "input_audio_buffer_commit_empty",
            )
        samples = pcm16_to_float(bytes(self.buffer))
        self.buffer.clear()
        self._check_memory(samples.nbytes, event_id)
        previous = self.conversation.last_id()
        turn = self.conversation.user_audio(samples, item_id)
        self.turn(item_id).mark("turn_confirmed")
        self.send(ev.Committed(item_id=item_id, previous_item_id=previous))
        self.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
        if transcribe:
            self._transcribe(turn)
        return turn

    async def clear(self, event: ev.InputAudioBufferClear) -> None:
        self.buffer.clear()
        self._live_drop()
        self._reset_vad()
        self.send(ev.Cleared())
