"""The response lifecycle: ``response.create`` starts one (at most one at a time), in a task
(:class:`~omnictl.serving.realtime.responses.ResponseRun`, which streams it); ``response.cancel``,
``output_audio_buffer.clear`` and barge-in stop it; every one ends with ``response.done``."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

import msgspec

from omnictl.audio import pcm16_to_float
from omnictl.inputs import PCM16_RATE, ChatRequest
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import codec_for
from omnictl.serving.realtime.responses import ResponseRun
from omnictl.serving.realtime.session.core import SessionCore
from omnictl.serving.realtime.session.milestones import TurnClock
from omnictl.serving.realtime.session.settings import (
    RESPONSE_UNHONOURED,
    TEMPERATURE,
    in_range,
    known_voice,
    max_tokens,
    metadata,
    no_tools,
    unhonoured,
)
from omnictl.serving.realtime.turns import Turn
from omnictl.serving.realtime.vad import to_vad_rate


class Lifecycle(SessionCore):
    async def response_create(self, event: ev.ResponseCreate) -> None:
        refuse = ev.Refusal(event.event_id)
        if self.settings.type == "transcription":
            raise refuse(
                "response.create: a transcription session only transcribes; open a 'realtime' session for answers",
                "invalid_request",
                "type",
            )
        if self.response is not None:
            raise refuse(
                f"response {self.response[0].id} is still in progress; cancel it or wait for response.done",
                "conversation_already_has_active_response",
            )
        self._start_response(event.response, event.event_id)

    def _start_response(self, config: ev.ResponseConfig, event_id: str | None) -> None:
        run, build = self._response_run(config, event_id, self._unanswered_clock())
        self._respond(run, lambda: build(self.conversation.turns))

    def _unanswered_clock(self) -> TurnClock | None:
        """The latest turn's milestones, if it has no answer yet (a later response, e.g. to a
        text item, is no turn's)."""
        clock = self.turn_clock
        return clock if clock is not None and "response_started" not in clock.stamps else None

    def _response_run(
        self, config: ev.ResponseConfig, event_id: str | None, clock: TurnClock | None
    ) -> tuple[ResponseRun, Callable[[Sequence[Turn]], ChatRequest]]:
        """A response as the session's settings and ``config`` say, not started; and what
        builds its request from the items given (the conversation's, as a rule)."""
        no_tools(config.tools, config.tool_choice, "response", event_id)
        unhonoured(config, RESPONSE_UNHONOURED, "response", event_id)
        s = self.settings
        codec, voice_name = s.output_codec, s.voice  # the session's, unless this response sets its own
        out = config.audio.output if config.audio is not msgspec.UNSET else msgspec.UNSET
        if out is not msgspec.UNSET and out.format is not msgspec.UNSET:
            codec = codec_for(out.format, "response.audio.output.format", event_id)
        if out is not msgspec.UNSET and out.voice is not msgspec.UNSET:
            voice_name = known_voice(self.pipeline.topology, out.voice, "response.audio.output.voice", event_id)
        tags = None if config.metadata is msgspec.UNSET else metadata(config.metadata, "response.metadata", event_id)
        modalities = s.output_modalities
        if config.output_modalities is not msgspec.UNSET:
            modalities = self._modalities(config.output_modalities, "response.output_modalities", event_id)
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
            modalities,
            self.send,
            self.state,
            self.pipeline,
            traceparent=self.traceparent,
            codec=codec,
            on_audio=self._sent_audio,
            audio_out=self.audio_out,
            clock=clock,
            max_output_tokens=effective if isinstance(effective, int) else "inf",
            metadata=tags,
        )
        speed = s.speed
        return run, lambda turns: self.conversation.request(instructions, sampling, voice, turns, speed=speed)

    def _respond(
        self,
        run: ResponseRun,
        build: Callable[[], ChatRequest],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``run`` becomes the session's response, sent in a task (after ``ready``, if given)."""

        async def respond() -> None:
            try:
                if ready is not None:
                    await ready()
                await run.run(self.conversation, build)
            finally:
                if self.audio_out is not None:
                    self.audio_out.finish(run.id)
                if self.response is not None and self.response[0] is run:
                    self.response = None

        self.response = (run, self._spawn(respond()))

    def _sent_audio(self, pcm: bytes) -> None:
        if self.echo.enabled and self._frontend.speech is not None:  # only speech detection can mistake echo for speech
            self.echo.sent(to_vad_rate(pcm16_to_float(pcm), PCM16_RATE))

    async def response_cancel(self, event: ev.ResponseCancel) -> None:
        if self.response is None or (event.response_id and event.response_id != self.response[0].id):
            raise ev.Refusal(event.event_id)(
                "there is no response in progress to cancel"
                if self.response is None
                else f"response {event.response_id} is not in progress",
                "response_cancel_not_active",
                "response_id" if event.response_id else None,
            )
        run, task = self.response
        self._stop_playing()
        await run.cancel("client_cancelled")
        await asyncio.shield(task)

    def _stop_playing(self) -> None:
        """The answer's audio stops playing: the client stops it (a WebSocket), or the
        outbound track drops what it holds (WebRTC, which says so: ``output_audio_buffer.cleared``)."""
        self.echo.stop()
        if self.audio_out is not None:
            self.audio_out.clear()

    async def output_audio_clear(self, event: ev.OutputAudioBufferClear) -> None:
        """Over a WebSocket the client holds the audio it was sent: clearing it here means no more
        of the answer's audio comes, so the response in progress is cancelled. Over WebRTC the
        server holds it: the track drops it (``output_audio_buffer.cleared``), and a response
        still in progress is cancelled too."""
        refuse = ev.Refusal(event.event_id)
        if self.audio_out is not None:
            cancelled = None
            if self.response is not None:
                run, task = self.response
                await run.cancel("client_cancelled")
                await asyncio.shield(task)
                cancelled = run.id
            if not self.audio_out.clear():  # the track held none of it (it tells the client when it did)
                if cancelled is None:
                    raise refuse("output_audio_buffer.clear: no audio is playing", "response_cancel_not_active")
                self.send(ev.OutputAudioBufferCleared(response_id=cancelled))  # its audio will not play
            self.echo.stop()
            return
        if self.response is None:
            raise refuse("output_audio_buffer.clear: no response is sending audio", "response_cancel_not_active")
        run, task = self.response
        self._stop_playing()
        await run.cancel("client_cancelled")
        await asyncio.shield(task)
        self.send(ev.OutputAudioBufferCleared(response_id=run.id))
