"""``session.update``, and the session object ``session.created`` / ``session.updated`` report.

Every field an update names is checked before any is applied: a refused update changes
nothing, and its ``error`` event names the field (``session.audio.output.voice``...).

:class:`Configure` is handed the echo guard (``audio.input.echo_guard``), the response in
progress (whose type cannot change under it) and what restarts turn detection."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import msgspec

from omnictl.exceptions import LaunchError
from omnictl.inputs import is_language_code
from omnictl.serving.common.echo import clip, clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import EchoGuard
from omnictl.serving.realtime.formats import codec_for
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.session.settings import (
    NOISE_REDUCTION,
    PADDING_MS,
    SESSION_TYPES,
    SESSION_UNHONOURED,
    SILENCE_MS,
    SPEED,
    TEMPERATURE,
    THRESHOLD,
    TRANSCRIPTION_UNHONOURED,
    in_range,
    known_voice,
    max_tokens,
    modalities,
    no_tools,
    recognised_languages,
    unhonoured,
)
from omnictl.serving.realtime.smart_turn import shared_model
from omnictl.serving.realtime.vad import vad_executor


class Configure:
    def __init__(
        self,
        ctx: SessionContext,
        echo: EchoGuard,
        responding: Callable[[], str | None],
        reset_detection: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.echo = echo
        self._responding = responding  # the id of the response in progress, if any
        self._reset_detection = reset_detection  # turn detection starts again as the settings now say

    def session_object(self) -> ev.SessionObject | ev.TranscriptionSessionObject:
        """What the session does, as it does it: transcription is on when transcripts are sent."""
        s = self.ctx.settings
        turn_detection = None if s.vad is None else msgspec.to_builtins(s.vad)
        transcriber = self.ctx.transcriber()
        audio_input = {
            "format": s.input_codec.describe(),
            "turn_detection": turn_detection,
            "transcription": (
                ({"model": transcriber} | ({"language": s.language} if s.language else {}))
                if s.transcription and transcriber
                else None
            ),
            "noise_reduction": None,
            "echo_guard": self.echo.enabled,
        }
        if s.type == "transcription":
            return ev.TranscriptionSessionObject(
                id=self.ctx.id, audio={"input": audio_input}, transport=self.ctx.transport
            )
        audio = {
            "input": audio_input,
            "output": {"format": s.output_codec.describe(), "voice": s.voice, "speed": s.speed},
        }
        return ev.SessionObject(
            id=self.ctx.id,
            model=self.ctx.model,
            instructions=s.instructions,
            output_modalities=s.output_modalities,
            audio=audio,
            max_output_tokens=s.max_output_tokens,  # type: ignore[arg-type]  # an int, or "inf" (checked on update)
            transport=self.ctx.transport,
        )

    async def session_update(self, event: ev.SessionUpdate) -> None:
        config, s, refuse = event.session, self.ctx.settings, ev.Refusal(event.event_id)
        kind = s.type if config.type is msgspec.UNSET else config.type
        if kind not in SESSION_TYPES:
            raise refuse(
                f"session.type {clip_repr(kind, 64)} is not supported; this server runs 'realtime' and "
                "'transcription' sessions",
                "unsupported_session_type",
                "session.type",
            )
        if kind == "transcription" and not self.ctx.can_transcribe:
            raise refuse(
                f"session.type 'transcription': topology {self.ctx.pipeline.topology.name!r} has no terminal of "
                "modality 'transcript' (nothing here recognises speech)",
                "unsupported_session_type",
                "session.type",
            )
        if kind == "realtime" and not self.ctx.can_answer:
            raise refuse(
                f"session.type 'realtime': topology {self.ctx.pipeline.topology.name!r} only transcribes (a "
                "'transcript' terminal, no text or audio one): nothing answers a conversation; this session can "
                "only be a 'transcription' one",
                "unsupported_session_type",
                "session.type",
            )
        responding = self._responding()
        if responding is not None and kind != s.type:
            raise refuse(f"session.type cannot change while response {responding} is in progress", param="session.type")
        no_tools(config.tools, config.tool_choice, "session", event.event_id)
        unhonoured(config, SESSION_UNHONOURED, "session", event.event_id)
        served = (self.ctx.state.model_name, *self.ctx.state.aliases)
        if config.model is not msgspec.UNSET and config.model not in served:
            raise refuse(  # as the handshake's ?model= is checked
                f"session.model {clip_repr(config.model, 64)} is not served here; this server serves "
                f"{', '.join(repr(m) for m in served)}",
                "model_not_found",
                "session.model",
            )
        temperature = s.temperature  # each field is checked before anything changes
        if config.temperature is not msgspec.UNSET:
            temperature = in_range(config.temperature, TEMPERATURE, "session.temperature", event.event_id)
        wanted = s.output_modalities
        if config.output_modalities is not msgspec.UNSET:
            wanted = modalities(
                self.ctx.pipeline.topology, config.output_modalities, "session.output_modalities", event.event_id
            )
        limit = s.max_output_tokens
        if config.max_output_tokens is not msgspec.UNSET:
            limit = max_tokens(config.max_output_tokens, "session.max_output_tokens", event.event_id)
        if config.audio is not msgspec.UNSET:
            await self._audio(config.audio, event.event_id)  # the last check: it applies what it checked
        if config.instructions is not msgspec.UNSET:
            s.instructions = config.instructions
        s.type, s.temperature, s.output_modalities, s.max_output_tokens = kind, temperature, wanted, limit
        self.ctx.send(ev.SessionUpdated(session=self.session_object()))

    def _check_transcription(self, config: dict[str, Any] | None, event_id: str | None) -> str | None:
        """The ``language`` of ``audio.input.transcription`` (None: the recognizer's default),
        checked; refuse what else of it the recognizer cannot take. Its ``model`` passes
        whatever it names: the topology's recognizer transcribes, and ``session.updated`` names
        it (a client's 'whisper-1' is often what the voice assistant's recognizer is)."""
        where = "session.audio.input.transcription"
        language = (config or {}).get("language")
        if language is not None and not is_language_code(language):
            raise ev.Refusal(event_id)(
                f"{where}.language must be a language code such as 'en' or 'fr', got {clip_repr(language, 64)}",
                param=f"{where}.language",
            )
        known = recognised_languages()
        if language is not None and known is not None and language.lower() not in known:
            # Taken, every turn would then come back transcription_failed: refused here instead.
            raise ev.Refusal(event_id)(
                f"{where}.language {clip_repr(language, 64)} is not a language the recognizer (Whisper) knows; "
                "use an ISO-639-1 code such as 'en', 'fr' or 'de', or null for the recognizer's own choice",
                param=f"{where}.language",
            )
        for key, value in (config or {}).items():
            if key in ("model", "language"):
                continue
            if key not in TRANSCRIPTION_UNHONOURED:
                raise ev.Refusal(event_id)(
                    f"{where}.{clip(key, 64)} is not a field of {where} (model, language, {', '.join(TRANSCRIPTION_UNHONOURED)})",
                    param=f"{where}.{clip(key, 64)}",
                )
            if value not in (None, "", []):
                raise ev.Refusal(event_id)(
                    f"{where}.{key} {clip_repr(value, 64)} is not supported: the topology's recognizer takes no "
                    f"{key} from a realtime session; send null or leave it out",
                    param=f"{where}.{key}",
                )
        return language.lower() if language else None

    async def _audio(self, audio: ev.AudioConfig, event_id: str | None) -> None:
        """Checks every field before changing any: a refused update changes nothing."""
        s, inp, out, refuse = self.ctx.settings, audio.input, audio.output, ev.Refusal(event_id)
        input_codec, output_codec = s.input_codec, s.output_codec
        if inp is not msgspec.UNSET and inp.format is not msgspec.UNSET:
            input_codec = codec_for(inp.format, "session.audio.input.format", event_id)
        if out is not msgspec.UNSET and out.format is not msgspec.UNSET:
            output_codec = codec_for(out.format, "session.audio.output.format", event_id)
        voice = s.voice
        if out is not msgspec.UNSET and out.voice is not msgspec.UNSET:
            voice = known_voice(self.ctx.pipeline.topology, out.voice, "session.audio.output.voice", event_id)
        speed = s.speed
        if out is not msgspec.UNSET and out.speed is not msgspec.UNSET:
            speed = float(in_range(out.speed, SPEED, "session.audio.output.speed", event_id))
        if inp is not msgspec.UNSET and isinstance(inp.turn_detection, ev.ServerVad):
            vad, where = inp.turn_detection, "session.audio.input.turn_detection"
            in_range(vad.threshold, THRESHOLD, f"{where}.threshold", event_id)
            in_range(vad.prefix_padding_ms, PADDING_MS, f"{where}.prefix_padding_ms", event_id, " ms")
            in_range(vad.silence_duration_ms, SILENCE_MS, f"{where}.silence_duration_ms", event_id, " ms")
            if vad.idle_timeout_ms is not None:
                raise refuse(
                    "session.audio.input.turn_detection.idle_timeout_ms: this server starts no response on its own "
                    "after an idle time; send null or leave it out",
                    param="session.audio.input.turn_detection.idle_timeout_ms",
                )
        if inp is not msgspec.UNSET and inp.noise_reduction not in (msgspec.UNSET, None):
            raise refuse(
                f"session.audio.input.noise_reduction: {NOISE_REDUCTION}", param="session.audio.input.noise_reduction"
            )
        transcription, language = s.transcription, s.language
        if inp is not msgspec.UNSET and inp.transcription is not msgspec.UNSET:
            if inp.transcription is not None and not self.ctx.can_transcribe:
                raise refuse(
                    f"session.audio.input.transcription: topology {self.ctx.pipeline.topology.name!r} has no terminal "
                    "of modality 'transcript'; send null",
                    param="session.audio.input.transcription",
                )
            language = self._check_transcription(inp.transcription, event_id)
            transcription = inp.transcription is not None
        if inp is not msgspec.UNSET and isinstance(inp.turn_detection, ev.SemanticVad):
            try:  # loaded once per server, off the event loop
                await asyncio.get_running_loop().run_in_executor(vad_executor(), shared_model)
            except LaunchError as exc:
                raise refuse(
                    f"session.audio.input.turn_detection.type 'semantic_vad': {exc}; use 'server_vad' or null",
                    param="session.audio.input.turn_detection.type",
                ) from exc
        s.input_codec, s.output_codec, s.transcription, s.language = input_codec, output_codec, transcription, language
        if inp is not msgspec.UNSET and inp.echo_guard is not msgspec.UNSET:
            self.echo.enabled = inp.echo_guard
        s.voice, s.speed = voice, speed
        if inp is not msgspec.UNSET and inp.turn_detection is not msgspec.UNSET:
            s.vad = inp.turn_detection
            self._reset_detection()
