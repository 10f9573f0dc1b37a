"""One realtime session: its settings, input audio buffer, turn detection, conversation,
and the handler of each client event.

Handlers run one at a time, in the order the events arrived; what takes long (a
transcription, a response) runs in a task, so the session keeps listening, which is
what lets speech interrupt an answer (barge-in). Each handler either does what its
event asks or raises :class:`~omnictl.serving.realtime.events.EventError`, which the
route answers with an ``error`` event; the session goes on either way.

A session is a ``realtime`` one (a conversation answered by the pipeline) or a
``transcription`` one (``?intent=transcription`` or ``session.type: "transcription"``):
its committed turns are only transcribed, each one told as
``conversation.item.input_audio_transcription.delta`` / ``.completed``; no responses.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Sequence

import msgspec
import numpy as np

from omnictl.coordinator.request import RequestEventKind
from omnictl.exceptions import InvalidRequest, LaunchError, Overloaded, PipelineDead
from omnictl.inputs import PCM16_RATE, AudioPart, ChatMessage, ChatRequest, SamplingParams
from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.echo import clip_repr
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import ECHO_SHARE, WINDOW_MS, EchoGuard
from omnictl.serving.realtime.formats import PCM, AudioCodec, codec_for
from omnictl.serving.realtime.responses import ResponseRun
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector, shared_model
from omnictl.serving.realtime.turns import Conversation, Turn
from omnictl.serving.realtime.vad import (
    VAD_RATE,
    SileroModel,
    SileroVad,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    VadSettings,
    to_vad_rate,
    vad_executor,
)
from omnictl.serving.speech.voices import installed_voices
from omnictl.serving.state import PipelineLike, ServingState

log = logging.getLogger("omnictl.serving.realtime")

MIN_COMMIT_MS = 100  # a commit of less audio than this is refused, as OpenAI refuses it
PREFIX_MS = 300  # audio kept before speech starts, where the turn detection has no setting for it
DEFAULT_VOICE = "alloy"  # an OpenAI name: the topology's default voice


SESSION_TYPES = ("realtime", "transcription")
# The OpenAI Realtime protocol's ranges; a value outside is refused naming its field.
THRESHOLD = (0.0, 1.0)  # server_vad's activation threshold
PADDING_MS = (0, 10_000)  # server_vad's prefix_padding_ms: audio kept before speech (held in the buffer)
SILENCE_MS = (0, 10_000)  # server_vad's silence_duration_ms: the silence that ends a turn
TEMPERATURE = (0.6, 1.2)  # a realtime model's sampling temperature
SPEED = (0.25, 1.5)  # the answer's speaking speed
# A voice a topology that lists none may take: a name, never a path ("../../x").
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TRANSPORTS = ("websocket", "webrtc")


class AudioOut(Protocol):
    """Where a transport that plays the answer itself takes its audio (WebRTC's outbound track):
    then no ``response.output_audio.delta`` is sent, and the transport says when playing starts,
    stops, and is cleared (``output_audio_buffer.started`` / ``.stopped`` / ``.cleared``)."""

    def play(self, response_id: str, pcm: bytes) -> None:
        """Queue pcm16 at 24 kHz of ``response_id`` to play after what is queued."""

    def finish(self, response_id: str) -> None:
        """No more audio comes for ``response_id``: once what is queued is played, it has stopped."""

    def clear(self) -> bool:
        """Drop what is queued and stop playing now; True if anything was playing."""


@dataclass
class Settings:
    type: str = "realtime"  # or "transcription": turns are transcribed, never answered
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    vad: ev.TurnDetection | None = field(default_factory=ev.ServerVad)  # None: the client commits turns
    voice: str = DEFAULT_VOICE
    max_output_tokens: int | str = "inf"
    temperature: float | None = None  # None: the stage's own
    transcription: bool = True  # transcripts of the user's audio are sent (when the topology transcribes)
    input_codec: AudioCodec = PCM
    output_codec: AudioCodec = PCM

    def sampling(self, override: int | str | None = None, temperature: float | None = None) -> SamplingParams:
        limit = self.max_output_tokens if override is None else override
        return SamplingParams(
            max_tokens=limit if isinstance(limit, int) else None,
            temperature=self.temperature if temperature is None else temperature,
        )


def in_range(value: float, bounds: tuple[float, float], param: str, event_id: str | None, unit: str = "") -> float:
    """``value`` if it is a finite number within ``bounds``; else the error naming ``param``."""
    low, high = bounds
    if isinstance(value, bool) or not math.isfinite(value) or not low <= value <= high:
        raise ev.EventError(
            f"{param} must be from {low:g} to {high:g}{unit}, got {clip_repr(value, 64)}",
            "invalid_value",
            param,
            event_id,
        )
    return value


def _detect(
    vad: SileroVad, turns: TurnDetector | SemanticTurnDetector, raw: bytes
) -> tuple[np.ndarray, list[SpeechStarted | SpeechStopped]]:
    """pcm16 at 24 kHz: (the audio at 16 kHz, the turns it starts or ends)."""
    audio = to_vad_rate(np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0, PCM16_RATE)
    probabilities = vad.feed(audio)
    if isinstance(turns, SemanticTurnDetector):  # the turn model hears the same audio
        return audio, turns.feed(probabilities, audio)
    return audio, turns.feed(probabilities)


@dataclass
class AudioRate:
    """A token bucket of audio seconds: ``burst_s`` at once, then ``speed`` x real time."""

    speed: float
    burst_s: float
    allowance: float = field(init=False)
    _at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.allowance = self.burst_s

    def take(self, seconds: float) -> bool:
        """Whether ``seconds`` of audio may be taken now (and, if so, take them)."""
        now = time.monotonic()
        self.allowance = min(self.burst_s, self.allowance + (now - self._at) * self.speed)
        self._at = now
        if seconds > self.allowance:
            return False
        self.allowance -= seconds
        return True


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
        self.state, self.pipeline, self.send, self.model = state, pipeline, send, model
        self.transport = transport
        self.audio_out = audio_out  # None: the answer's audio goes out as events
        self.traceparent = traceparent  # the handshake's: every request of the session is its child
        self.id = ev.new_id("sess")
        self.settings = Settings()
        limits = state.limits
        self.conversation = Conversation(max_tokens=limits.max_realtime_conversation_tokens)
        self._audio_rate = AudioRate(limits.realtime_audio_speed, limits.realtime_audio_burst_s)
        self._transcribing: dict[int, Turn] = {}  # spoken items whose audio a transcription holds
        self.buffer = bytearray()  # pcm16 24 kHz, since the last commit or clear
        self.audio_ms = 0.0  # audio appended over the whole session
        self._silero = silero
        self._vad: SileroVad | None = None
        self._turns: TurnDetector | SemanticTurnDetector | None = None
        self._speech_item: str | None = None
        self.echo = EchoGuard()
        # A browser's WebRTC stack cancels its own echo: the guard is off there unless asked for.
        self.echo.enabled = transport != "webrtc"
        self._held_start: tuple[int, float] | None = None  # speech held for the echo guard: (start ms, at audio ms)
        self.response: tuple[ResponseRun, asyncio.Task[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.can_transcribe = capabilities(pipeline.topology).transcription
        self.settings.transcription = self.can_transcribe
        if intent == "transcription":
            self.settings.type = "transcription"
        self._reset_vad()

    # --- session ---------------------------------------------------------------------------

    def transcriber(self) -> str | None:
        """The topology stage that transcribes the user's audio."""
        terminals = self.pipeline.topology.terminals
        return next((name for name, modality in terminals.items() if modality == TRANSCRIPT), None)

    def session_object(self) -> ev.SessionObject | ev.TranscriptionSessionObject:
        """What the session does, as it does it: transcription is on when transcripts are sent."""
        s = self.settings
        turn_detection = None if s.vad is None else msgspec.to_builtins(s.vad)
        transcriber = self.transcriber()
        audio_input = {
            "format": s.input_codec.describe(),
            "turn_detection": turn_detection,
            "transcription": {"model": transcriber} if s.transcription and transcriber else None,
            "noise_reduction": None,
            "echo_guard": self.echo.enabled,
        }
        if s.type == "transcription":
            return ev.TranscriptionSessionObject(id=self.id, audio={"input": audio_input}, transport=self.transport)
        audio = {"input": audio_input, "output": {"format": s.output_codec.describe(), "voice": s.voice, "speed": 1.0}}
        return ev.SessionObject(
            id=self.id,
            model=self.model,
            instructions=s.instructions,
            output_modalities=s.output_modalities,
            audio=audio,
            max_output_tokens=s.max_output_tokens,  # type: ignore[arg-type]  # an int, or "inf" (checked on update)
            transport=self.transport,
        )

    def _reset_vad(self) -> None:
        vad = self.settings.vad
        self._vad = None if vad is None else SileroVad(self._silero(), VAD_RATE)  # fed 16 kHz (_detect)
        self._turns = None
        self._held_start = None
        if isinstance(vad, ev.ServerVad):
            self._turns = TurnDetector(VadSettings(vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms))
        elif isinstance(vad, ev.SemanticVad):
            self._turns = SemanticTurnDetector(shared_model(), vad.eagerness)
        self._speech_item = None

    async def session_update(self, event: ev.SessionUpdate) -> None:
        config, s = event.session, self.settings
        kind = s.type if config.type is msgspec.UNSET else config.type
        if kind not in SESSION_TYPES:
            raise ev.EventError(
                f"session.type {clip_repr(kind, 64)} is not supported; this server runs 'realtime' and "
                "'transcription' sessions",
                "unsupported_session_type",
                "session.type",
                event.event_id,
            )
        if kind == "transcription" and not self.can_transcribe:
            raise ev.EventError(
                f"session.type 'transcription': topology {self.pipeline.topology.name!r} has no terminal of "
                "modality 'transcript' (nothing here recognises speech)",
                "unsupported_session_type",
                "session.type",
                event.event_id,
            )
        if self.response is not None and kind != s.type:
            raise ev.EventError(
                f"session.type cannot change while response {self.response[0].id} is in progress",
                "invalid_value",
                "session.type",
                event.event_id,
            )
        _no_tools(config.tools, config.tool_choice, "session", event.event_id)
        temperature = s.temperature
        if config.temperature is not msgspec.UNSET:  # checked before anything changes
            temperature = in_range(config.temperature, TEMPERATURE, "session.temperature", event.event_id)
        if config.output_modalities is not msgspec.UNSET:
            s.output_modalities = self._modalities(
                config.output_modalities, "session.output_modalities", event.event_id
            )
        if config.audio is not msgspec.UNSET:
            await self._audio(config.audio, event.event_id)
        if config.instructions is not msgspec.UNSET:
            s.instructions = config.instructions
        if config.max_output_tokens is not msgspec.UNSET:
            s.max_output_tokens = self._max_tokens(
                config.max_output_tokens, "session.max_output_tokens", event.event_id
            )
        s.type, s.temperature = kind, temperature
        self.send(ev.SessionUpdated(session=self.session_object()))

    def _modalities(self, wanted: Sequence[str], param: str, event_id: str | None) -> list[str]:
        produces = set(self.pipeline.topology.terminals.values())
        missing = [m for m in wanted if m not in produces]
        if not wanted or missing:
            raise ev.EventError(
                f"{param}: this topology produces {', '.join(sorted(produces))}; cannot give {wanted!r}",
                "invalid_value",
                param,
                event_id,
            )
        return list(dict.fromkeys(wanted))

    @staticmethod
    def _max_tokens(value: int | str, param: str, event_id: str | None) -> int | str:
        if value != "inf" and (not isinstance(value, int) or value < 1):
            raise ev.EventError(
                f"{param} must be a positive integer or 'inf', got {value!r}", "invalid_value", param, event_id
            )
        return value

    def _voice(self, voice: str, event_id: str | None) -> str:
        """A voice this topology has: one it lists (``GET /v1/audio/voices``) or an OpenAI name
        (its default voice); where it lists none, any plain name (never a path)."""
        listed = installed_voices(self.pipeline.topology)
        known = voice in OPENAI_VOICES or (voice in listed if listed is not None else VOICE_NAME.fullmatch(voice))
        if not known:
            names = sorted(OPENAI_VOICES | set(listed or ()))
            raise ev.EventError(
                f"session.audio.output.voice {clip_repr(voice, 64)} is not a voice of this server; it has "
                + (", ".join(names) if listed is not None else f"OpenAI's names ({', '.join(names)}) or plain names"),
                "invalid_value",
                "session.audio.output.voice",
                event_id,
            )
        return voice

    async def _audio(self, audio: ev.AudioConfig, event_id: str | None) -> None:
        """Checks every field before changing any: a refused update changes nothing."""
        s, inp, out = self.settings, audio.input, audio.output
        input_codec, output_codec = s.input_codec, s.output_codec
        if inp is not msgspec.UNSET and inp.format is not msgspec.UNSET:
            input_codec = codec_for(inp.format, "session.audio.input.format", event_id)
        if out is not msgspec.UNSET and out.format is not msgspec.UNSET:
            output_codec = codec_for(out.format, "session.audio.output.format", event_id)
        voice = s.voice
        if out is not msgspec.UNSET and out.voice is not msgspec.UNSET:
            voice = self._voice(out.voice, event_id)
        if out is not msgspec.UNSET and out.speed is not msgspec.UNSET:
            in_range(out.speed, SPEED, "session.audio.output.speed", event_id)
        if inp is not msgspec.UNSET and isinstance(inp.turn_detection, ev.ServerVad):
            vad, where = inp.turn_detection, "session.audio.input.turn_detection"
            in_range(vad.threshold, THRESHOLD, f"{where}.threshold", event_id)
            in_range(vad.prefix_padding_ms, PADDING_MS, f"{where}.prefix_padding_ms", event_id, " ms")
            in_range(vad.silence_duration_ms, SILENCE_MS, f"{where}.silence_duration_ms", event_id, " ms")
        transcription = s.transcription
        if inp is not msgspec.UNSET and inp.transcription is not msgspec.UNSET:
            if inp.transcription is not None and not self.can_transcribe:
                raise ev.EventError(
                    f"session.audio.input.transcription: topology {self.pipeline.topology.name!r} has no terminal "
                    "of modality 'transcript'; send null",
                    "invalid_value",
                    "session.audio.input.transcription",
                    event_id,
                )
            transcription = inp.transcription is not None
        if inp is not msgspec.UNSET and isinstance(inp.turn_detection, ev.SemanticVad):
            try:  # loaded once per server, off the event loop
                await asyncio.get_running_loop().run_in_executor(vad_executor(), shared_model)
            except LaunchError as exc:
                raise ev.EventError(
                    f"session.audio.input.turn_detection.type 'semantic_vad': {exc}; use 'server_vad' or null",
                    "invalid_value",
                    "session.audio.input.turn_detection.type",
                    event_id,
                ) from exc
        s.input_codec, s.output_codec, s.transcription = input_codec, output_codec, transcription
        if inp is not msgspec.UNSET and inp.echo_guard is not msgspec.UNSET:
            self.echo.enabled = inp.echo_guard
        s.voice = voice
        if inp is not msgspec.UNSET and inp.turn_detection is not msgspec.UNSET:
            s.vad = inp.turn_detection
            self._reset_vad()

    # --- input audio -----------------------------------------------------------------------

    async def append(self, event: ev.InputAudioBufferAppend) -> None:
        codec = self.settings.input_codec
        sent = len(event.audio) * 3 // 4 - event.audio[-2:].count("=")  # bytes, before decoding
        size = sent * PCM.bytes_per_second // codec.bytes_per_second  # what the buffer will hold of it
        limit = self.state.limits.max_realtime_buffer_bytes
        if len(self.buffer) + size > limit:
            raise ev.EventError(
                f"the input audio buffer is limited to {limit} bytes ({limit / 2 / PCM16_RATE:.0f} s of audio); "
                "commit or clear it",
                "input_audio_buffer_too_large",
                "audio",
                event.event_id,
            )
        if not self._audio_rate.take(size / 2 / PCM16_RATE):
            limits = self.state.limits
            raise ev.EventError(
                f"input_audio_buffer.append: audio arrives faster than this server takes it (at most "
                f"{limits.realtime_audio_speed:g}x real time after the first {limits.realtime_audio_burst_s:g} s); "
                "this append was dropped",
                "input_audio_rate_exceeded",
                "audio",
                event.event_id,
            )
        try:
            raw = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ev.EventError(
                f"input_audio_buffer.append: 'audio' is not valid base64 ({exc})",
                "invalid_base64",
                "audio",
                event.event_id,
            ) from exc
        if len(raw) % codec.sample_bytes:
            raise ev.EventError(
                f"input_audio_buffer.append: pcm16 audio must hold whole 16-bit samples, got {len(raw)} bytes",
                "invalid_audio",
                "audio",
                event.event_id,
            )
        await self.feed(codec.to_pcm16(raw), event.event_id)

    async def feed(self, raw: bytes, event_id: str | None = None) -> None:
        """pcm16 at 24 kHz into the input buffer and the turn detection: an append's audio, or
        a WebRTC microphone track's (which comes in real time, so it is not rate-limited)."""
        limit = self.state.limits.max_realtime_buffer_bytes
        if len(self.buffer) + len(raw) > limit:
            raise ev.EventError(
                f"the input audio buffer is limited to {limit} bytes ({limit / 2 / PCM16_RATE:.0f} s of audio); "
                "commit or clear it",
                "input_audio_buffer_too_large",
                "audio",
                event_id,
            )
        self.buffer += raw
        self.audio_ms += len(raw) / 2 / PCM16_RATE * 1000
        if self._vad is not None and self._turns is not None:
            # Resampling and Silero run in a worker thread: on the event loop, a flood of
            # appends once held /health for 41 s. This session waits for its own audio (and
            # so reads no more from its socket meanwhile); every other request goes on.
            vad, turns = self._vad, self._turns
            heard, found = await asyncio.get_running_loop().run_in_executor(vad_executor(), _detect, vad, turns, raw)
            if vad is not self._vad:  # cleared or reconfigured meanwhile
                return
            self.echo.heard(heard)
            for turn in found:
                if isinstance(turn, SpeechStarted) and self.echo.playing():
                    self._held_start = (turn.audio_start_ms, self.audio_ms)  # echo? judged once enough is heard
                elif isinstance(turn, SpeechStarted):
                    await self._speech_started(turn.audio_start_ms)
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
        assert self.settings.vad is not None
        if self.settings.vad.interrupt_response and self.response is not None:
            self._stop_playing()
            await self.response[0].cancel("turn_detected")  # barge-in

    async def _speech_stopped(self, audio_end_ms: int) -> None:
        item_id = self._speech_item or ev.new_id("item")
        self.send(ev.SpeechStoppedEvent(audio_end_ms=audio_end_ms, item_id=item_id))
        self._commit(item_id, None)
        assert self.settings.vad is not None
        if not self.settings.vad.create_response or self.settings.type == "transcription":
            return
        if self.response is not None:
            if self.response[0].cancel_reason is None:
                return  # still answering (interrupt_response off): the next response hears this turn
            await asyncio.shield(self.response[1])  # cancelled by this speech's start: it is sending its last events
        self._start_response(ev.ResponseConfig(), None)

    async def commit(self, event: ev.InputAudioBufferCommit) -> None:
        self._commit(ev.new_id("item"), event.event_id)

    def _commit(self, item_id: str, event_id: str | None) -> None:
        ms = len(self.buffer) / 2 / PCM16_RATE * 1000
        if ms < MIN_COMMIT_MS:
            raise ev.EventError(
                f"input_audio_buffer.commit: the buffer holds {ms:.0f} ms of audio; at least {MIN_COMMIT_MS} ms "
                "is needed",
                "input_audio_buffer_commit_empty",
                None,
                event_id,
            )
        samples = np.frombuffer(bytes(self.buffer), "<i2").astype(np.float32) / 32768.0
        self.buffer.clear()
        self._check_memory(samples.nbytes, event_id)
        previous = self.conversation.last_id()
        turn = self.conversation.user_audio(samples, item_id)
        self.send(ev.Committed(item_id=item_id, previous_item_id=previous))
        self.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
        self._transcribe(turn)

    async def clear(self, event: ev.InputAudioBufferClear) -> None:
        self.buffer.clear()
        self._reset_vad()
        self.send(ev.Cleared())

    # --- conversation ----------------------------------------------------------------------

    async def item_create(self, event: ev.ConversationItemCreate) -> None:
        item, where = event.item, "item.content"
        allowed = {
            "user": ("input_text", "input_audio"),
            "system": ("input_text",),
            "assistant": ("output_text", "output_audio"),
        }[item.role]
        if len(item.content) != 1:
            raise ev.EventError(
                f"{where} must hold exactly one part, got {len(item.content)}", "invalid_value", where, event.event_id
            )
        part = item.content[0]
        if part.type not in allowed:
            raise ev.EventError(
                f"{where}[0].type: a {item.role} item takes {', '.join(allowed)}, got {part.type!r}",
                "invalid_value",
                f"{where}[0].type",
                event.event_id,
            )
        previous = self.conversation.last_id()
        if item.id is not None and self.conversation.find(item.id) is not None:
            raise ev.EventError(
                f"item.id {clip_repr(item.id, 64)} is already in the conversation",
                "invalid_value",
                "item.id",
                event.event_id,
            )
        if part.type == "input_audio":
            codec = self.settings.input_codec
            try:
                raw = base64.b64decode(part.audio or "", validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ev.EventError(
                    f"{where}[0].audio is not valid base64 ({exc})",
                    "invalid_base64",
                    f"{where}[0].audio",
                    event.event_id,
                ) from exc
            limit = self.state.limits.max_realtime_buffer_bytes * codec.bytes_per_second // PCM.bytes_per_second
            if len(raw) < 2 or len(raw) % codec.sample_bytes or len(raw) > limit:
                raise ev.EventError(
                    f"{where}[0].audio must be {codec.type} at {codec.rate} Hz (the session's input format), up to "
                    f"{limit} bytes, got {len(raw)} bytes",
                    "invalid_audio",
                    f"{where}[0].audio",
                    event.event_id,
                )
            raw = codec.to_pcm16(raw)
            self._check_memory(len(raw) * 2, event.event_id)
            turn = self.conversation.user_audio(np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0, item.id)
            self.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
            self._transcribe(turn)
            return
        text = part.text if part.text is not None else part.transcript
        turn = self.conversation.text(item.role, text or "", item.id)
        turn.spoken = part.type == "output_audio"
        self.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
        self.send(ev.ItemDone(item=turn.item(), previous_item_id=previous))

    def held_bytes(self) -> int:
        """What this session holds: its input buffer, the conversation's audio and text, audio being transcribed."""
        turns = {id(t): t for t in (*self.conversation.turns, *self._transcribing.values())}
        return len(self.buffer) + sum(
            (t.audio.nbytes if t.audio is not None else 0) + len(t.text or "") for t in turns.values()
        )

    def _check_memory(self, adding: int, event_id: str | None) -> None:
        limit = self.state.limits.max_realtime_session_bytes
        held = self.held_bytes()
        if held + adding > limit:
            raise ev.EventError(
                f"this session holds {held / 2**20:.1f} MiB of audio and text; {adding / 2**20:.1f} MiB more "
                f"would pass its limit of {limit / 2**20:.0f} MiB (wait for transcriptions to finish, or "
                "start a new session)",
                "session_memory_limit",
                None,
                event_id,
            )

    def _transcribe(self, turn: Turn) -> None:
        """What the user said, by the topology's own speech recognition, as soon as it is committed."""
        if not self.can_transcribe:
            turn.transcribed.set()  # it goes to the pipeline as audio
            return
        self._transcribing[id(turn)] = turn
        self._spawn(self._transcription(turn))

    async def _transcription(self, turn: Turn) -> None:
        assert turn.audio is not None
        request = ChatRequest(
            messages=(
                ChatMessage(
                    role="user", parts=(AudioPart(samples=turn.audio, sample_rate=PCM16_RATE, field=f"item {turn.id}"),)
                ),
            )
        )
        tracked: Tracked | None = None
        try:
            submitted = await self.pipeline.submit(
                request, [TRANSCRIPT], request_id=ev.new_id("transcribe"), traceparent=self.traceparent
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
                        turn.id,
                        submitted.id,
                        event.error,
                    )
                    self.send(
                        ev.error_event(
                            ev.EventError(
                                f"transcribing item {turn.id} failed: {event.error}",
                                "transcription_failed",
                                kind="server_error",
                            )
                        )
                    )
                    return
            tracked.finish("completed")
            if heard is not None:
                turn.text = heard.text
                turn.release_audio()  # the transcript is what later responses hear
                self.conversation.trim()  # a transcript may weigh less (or more) than its audio did
            if heard is not None and self.settings.transcription:
                # The recogniser gives its transcript whole: one delta, then the completed text.
                self.send(ev.TranscriptionDelta(item_id=turn.id, content_index=0, delta=heard.text))
                self.send(
                    ev.TranscriptionCompleted(
                        item_id=turn.id,
                        content_index=0,
                        transcript=heard.text,
                        usage=ev.DurationUsage(seconds=round(heard.duration, 3)),
                    )
                )
            self.send(ev.ItemDone(item=turn.item()))
        except (InvalidRequest, Overloaded, PipelineDead) as exc:
            self.send(
                ev.error_event(
                    ev.EventError(
                        f"transcribing item {turn.id} failed: {exc}", "transcription_failed", kind="server_error"
                    )
                )
            )
        finally:
            if tracked is not None and tracked.outcome is None:  # the session closed meanwhile
                await self.pipeline.abort(tracked.request.id)
                tracked.finish("aborted")
            self._transcribing.pop(id(turn), None)
            turn.transcribed.set()  # a failed transcription leaves the audio for the response to hear

    # --- responses -------------------------------------------------------------------------

    async def response_create(self, event: ev.ResponseCreate) -> None:
        if self.settings.type == "transcription":
            raise ev.EventError(
                "response.create: a transcription session only transcribes; open a 'realtime' session for answers",
                "invalid_request",
                "type",
                event.event_id,
            )
        if self.response is not None:
            raise ev.EventError(
                f"response {self.response[0].id} is still in progress; cancel it or wait for response.done",
                "conversation_already_has_active_response",
                None,
                event.event_id,
            )
        self._start_response(event.response, event.event_id)

    def _start_response(self, config: ev.ResponseConfig, event_id: str | None) -> None:
        _no_tools(config.tools, config.tool_choice, "response", event_id)
        s = self.settings
        modalities = s.output_modalities
        if config.output_modalities is not msgspec.UNSET:
            modalities = self._modalities(config.output_modalities, "response.output_modalities", event_id)
        limit = None
        if config.max_output_tokens is not msgspec.UNSET:
            limit = self._max_tokens(config.max_output_tokens, "response.max_output_tokens", event_id)
        temperature = None
        if config.temperature is not msgspec.UNSET:
            temperature = in_range(config.temperature, TEMPERATURE, "response.temperature", event_id)
        instructions = s.instructions if config.instructions is msgspec.UNSET else config.instructions
        voice = None if s.voice in OPENAI_VOICES else s.voice
        sampling = s.sampling(limit, temperature)
        run = ResponseRun(
            ev.new_id("resp"),
            modalities,
            self.send,
            self.state,
            self.pipeline,
            traceparent=self.traceparent,
            codec=s.output_codec,
            on_audio=self._sent_audio,
            audio_out=self.audio_out,
        )

        async def respond() -> None:
            try:
                await run.run(self.conversation, lambda: self.conversation.request(instructions, sampling, voice))
            finally:
                if self.audio_out is not None:
                    self.audio_out.finish(run.id)
                if self.response is not None and self.response[0] is run:
                    self.response = None

        self.response = (run, self._spawn(respond()))

    def _sent_audio(self, pcm: bytes) -> None:
        if self.echo.enabled and self._vad is not None:  # only speech detection can mistake echo for speech
            self.echo.sent(to_vad_rate(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0, PCM16_RATE))

    async def response_cancel(self, event: ev.ResponseCancel) -> None:
        if self.response is None or (event.response_id and event.response_id != self.response[0].id):
            raise ev.EventError(
                "there is no response in progress to cancel"
                if self.response is None
                else f"response {event.response_id} is not in progress",
                "response_cancel_not_active",
                "response_id" if event.response_id else None,
                event.event_id,
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
        if self.audio_out is not None:
            if self.response is not None:
                run, task = self.response
                await run.cancel("client_cancelled")
                await asyncio.shield(task)
            if not self.audio_out.clear():
                raise ev.EventError(
                    "output_audio_buffer.clear: no audio is playing", "response_cancel_not_active", None, event.event_id
                )
            self.echo.stop()
            return
        if self.response is None:
            raise ev.EventError(
                "output_audio_buffer.clear: no response is sending audio",
                "response_cancel_not_active",
                None,
                event.event_id,
            )
        run, task = self.response
        self._stop_playing()
        await run.cancel("client_cancelled")
        await asyncio.shield(task)
        self.send(ev.OutputAudioBufferCleared(response_id=run.id))

    # --- conversation items by id ------------------------------------------------------------

    def _item(self, item_id: str, event_id: str | None, verb: str) -> Turn:
        turn = self.conversation.find(item_id)
        if turn is None:
            raise ev.EventError(
                f"conversation.item.{verb}: no item {clip_repr(item_id, 64)} in the conversation",
                "item_not_found",
                "item_id",
                event_id,
            )
        return turn

    async def item_truncate(self, event: ev.ConversationItemTruncate) -> None:
        """Cut a spoken answer to what the client played: the next response hears only those words."""
        turn = self._item(event.item_id, event.event_id, "truncate")
        if turn.role != "assistant" or not turn.spoken:
            raise ev.EventError(
                f"conversation.item.truncate: item {turn.id} is not an assistant audio message; only those "
                "can be truncated",
                "invalid_value",
                "item_id",
                event.event_id,
            )
        if event.content_index != 0:
            raise ev.EventError(
                f"conversation.item.truncate: content_index must be 0 (an item has one part), got "
                f"{event.content_index}",
                "invalid_value",
                "content_index",
                event.event_id,
            )
        if self.response is not None and self.response[0].turn is turn:
            run, task = self.response  # the client stopped playing it: no more of it is wanted
            self._stop_playing()
            await run.cancel("client_cancelled")
            await asyncio.shield(task)
        if not 0 <= event.audio_end_ms <= turn.audio_ms + 1:
            raise ev.EventError(
                f"conversation.item.truncate: audio_end_ms {event.audio_end_ms} is outside the item's audio "
                f"(0 to {turn.audio_ms:.0f} ms)",
                "invalid_value",
                "audio_end_ms",
                event.event_id,
            )
        turn.truncate(event.audio_end_ms)
        self.echo.stop()  # the client stopped playing it
        self.send(ev.ItemTruncated(item_id=turn.id, content_index=0, audio_end_ms=event.audio_end_ms))

    async def item_delete(self, event: ev.ConversationItemDelete) -> None:
        turn = self._item(event.item_id, event.event_id, "delete")
        if self.response is not None and self.response[0].turn is turn:
            raise ev.EventError(
                f"conversation.item.delete: item {turn.id} is the answer in progress; cancel the response first",
                "invalid_value",
                "item_id",
                event.event_id,
            )
        self.conversation.delete(turn)
        self.send(ev.ItemDeleted(item_id=turn.id))

    async def item_retrieve(self, event: ev.ConversationItemRetrieve) -> None:
        """The server's view of an item; a spoken user item still held carries its audio (input format)."""
        turn = self._item(event.item_id, event.event_id, "retrieve")
        item = turn.item()
        if turn.audio is not None:
            pcm = (np.clip(turn.audio, -1, 1) * 32767).astype("<i2").tobytes()
            item.content[0].audio = base64.b64encode(self.settings.input_codec.from_pcm16(pcm)).decode()
        self.send(ev.ItemRetrieved(item=item))

    # --- plumbing --------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def handle(self, event: ev.ClientEvent) -> None:
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

    async def close(self) -> None:
        """The socket closed: cancel the response, abort every pipeline request of this session."""
        if self.response is not None:
            await self.response[0].cancel("client_cancelled")
        if self.audio_out is not None:
            self.audio_out.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _no_tools(tools: Any, choice: Any, where: str, event_id: str | None) -> None:
    """Tools offered are refused, not ignored (as on chat completions): no omnictl terminal
    produces tool calls. An empty list and ``auto`` / ``none`` (what clients send by
    default) ask for nothing and pass."""
    if tools is not msgspec.UNSET and tools:
        raise ev.EventError(
            f"{where}.tools: this topology cannot call tools (no stage produces tool calls); send no tools",
            "invalid_value",
            f"{where}.tools",
            event_id,
        )
    if choice is not msgspec.UNSET and choice not in ("auto", "none"):
        raise ev.EventError(
            f"{where}.tool_choice {clip_repr(choice)}: this topology cannot call tools; only 'auto' or 'none'",
            "invalid_value",
            f"{where}.tool_choice",
            event_id,
        )
