"""A realtime session's settings, and the checks a value must pass to become one.

The ranges are the OpenAI Realtime protocol's; a value outside one is refused with an
``error`` event naming its field (:func:`in_range`), before anything of the update that
carried it is applied (:mod:`.configure`)."""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import msgspec

from omnictl.sampling import SamplingParams
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.common.echo import clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import PCM, AudioCodec
from omnictl.serving.speech.voices import installed_voices

DEFAULT_VOICE = "alloy"  # an OpenAI name: the topology's default voice
SESSION_TYPES = ("realtime", "transcription")
TRANSPORTS = ("websocket", "webrtc")
# The OpenAI Realtime protocol's ranges; a value outside is refused naming its field.
THRESHOLD = (0.0, 1.0)  # server_vad's activation threshold
PADDING_MS = (0, 10_000)  # server_vad's prefix_padding_ms: audio kept before speech (held in the buffer)
SILENCE_MS = (0, 10_000)  # server_vad's silence_duration_ms: the silence that ends a turn
TEMPERATURE = (0.6, 1.2)  # a realtime model's sampling temperature
SPEED = (0.25, 1.5)  # the answer's speaking speed
# A voice a topology that lists none may take: a name, never a path ("../../x").
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class Settings:
    type: str = "realtime"  # or "transcription": turns are transcribed, never answered
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    vad: ev.TurnDetection | None = field(default_factory=ev.ServerVad)  # None: the client commits turns
    voice: str = DEFAULT_VOICE
    speed: float = 1.0  # the answer's speaking speed (audio.output.speed); the TTS stage applies it
    max_output_tokens: int | str = "inf"
    temperature: float | None = None  # None: the stage's own
    transcription: bool = True  # transcripts of the user's audio are sent (when the topology transcribes)
    language: str | None = None  # of the user's speech (transcription.language); None: the recognizer's default
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
        raise ev.Refusal(event_id)(
            f"{param} must be from {low:g} to {high:g}{unit}, got {clip_repr(value, 64)}", param=param
        )
    return value


def modalities(topology: Any, wanted: Sequence[str], param: str, event_id: str | None) -> list[str]:
    """``wanted`` if ``topology`` produces it, else the error naming ``param``."""
    produces = set(topology.terminals.values())
    missing = [m for m in wanted if m not in produces]
    if not wanted or missing:
        raise ev.Refusal(event_id)(
            f"{param}: this topology produces {', '.join(sorted(produces))}; cannot give {wanted!r}", param=param
        )
    return list(dict.fromkeys(wanted))


def known_voice(topology: Any, voice: str, param: str, event_id: str | None) -> str:
    """A voice ``topology`` has: one it lists (``GET /v1/audio/voices``) or an OpenAI name
    (its default voice); where it lists none, any plain name (never a path)."""
    listed = installed_voices(topology)
    known = voice in OPENAI_VOICES or (voice in listed if listed is not None else VOICE_NAME.fullmatch(voice))
    if not known:
        names = sorted(OPENAI_VOICES | set(listed or ()))
        raise ev.Refusal(event_id)(
            f"{param} {clip_repr(voice, 64)} is not a voice of this server; it has "
            + (", ".join(names) if listed is not None else f"OpenAI's names ({', '.join(names)}) or plain names"),
            param=param,
        )
    return voice


def metadata(value: dict[str, str] | None, param: str, event_id: str | None) -> dict[str, str] | None:
    """OpenAI's bounds on metadata: at most 16 pairs, keys of 64 characters, values of 512."""
    if value is not None and (len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
        raise ev.Refusal(event_id)(
            f"{param} holds at most 16 pairs, keys of up to 64 characters and values of up to 512", param=param
        )
    return value


def max_tokens(value: int | str, param: str, event_id: str | None) -> int | str:
    """A positive integer or ``"inf"``; else the error naming ``param``."""
    if value != "inf" and (not isinstance(value, int) or value < 1):
        raise ev.Refusal(event_id)(f"{param} must be a positive integer or 'inf', got {value!r}", param=param)
    return value


# Fields of the protocol this server reads but cannot honour, each with the one value that
# asks for nothing (a test of the value sent) and why another cannot be: any other value is
# refused naming the field, never accepted and ignored. What is left out passes.
Unhonoured = dict[str, tuple[Callable[[Any], bool], str]]
_NULL = "send null or leave it out"
SESSION_UNHONOURED: Unhonoured = {
    "include": (lambda v: not v, "this server sends no transcription logprobs; send [] or leave it out"),
    # 'auto' (what the openai-agents SDK sends) and null pass: the server traces every session
    # its own way, as its operator set it (spans under the handshake's traceparent, each turn's
    # milestones); a workflow name, group or metadata would go nowhere.
    "tracing": (
        lambda v: v in (None, "auto"),
        "this server keeps its own traces (spans under the handshake's traceparent) and takes no "
        "workflow name, group or metadata for them; send 'auto' or null",
    ),
    "truncation": (
        lambda v: v == "auto",
        "the conversation is trimmed from its oldest items past the server's "
        "limit on its size (max_realtime_conversation_tokens), as 'auto' does; only 'auto'",
    ),
    "prompt": (lambda v: v is None, f"this server has no stored prompts; {_NULL}"),
    "reasoning": (lambda v: v is None, f"no stage here takes a reasoning setting; {_NULL}"),
}
RESPONSE_UNHONOURED: Unhonoured = {
    "conversation": (
        lambda v: v in (None, "auto"),
        "every response here answers the session's conversation and is added "
        "to it (no out-of-band responses); only 'auto'",
    ),
    "input": (
        lambda v: False,
        "a response answers the session's conversation; out-of-band input is not supported, leave it out",
    ),
    "prompt": SESSION_UNHONOURED["prompt"],
    "reasoning": SESSION_UNHONOURED["reasoning"],
}
# The keys of session.audio.input.transcription besides ``model`` and ``language`` (both
# taken): the topology's recognizer takes none of them from a realtime session.
TRANSCRIPTION_UNHONOURED = ("prompt", "delay", "keywords", "languages")
NOISE_REDUCTION = "this server filters no noise from the input audio; send null or leave it out"


@functools.cache
def recognised_languages() -> frozenset[str] | None:
    """The language codes the recognizer knows: Whisper's (faster-whisper's tokenizer; the
    shipped recognizers are Whisper). None where faster-whisper is not installed: no Whisper
    recognizer runs then, and a code is checked for its shape only."""
    if importlib.util.find_spec("faster_whisper") is None:
        return None
    # faster-whisper exposes the list only as this name (WhisperModel.supported_languages is
    # the same tuple, read from a loaded model); the recognizer itself checks against it.
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return frozenset(_LANGUAGE_CODES)


def unhonoured(config: Any, fields: Unhonoured, where: str, event_id: str | None) -> None:
    """Refuse each of ``fields`` that ``config`` sets to a value this server would not honour."""
    for name, (asks_nothing, why) in fields.items():
        value = getattr(config, name)
        if value is not msgspec.UNSET and not asks_nothing(value):
            raise ev.Refusal(event_id)(
                f"{where}.{name} {clip_repr(value, 64)} is not supported: {why}", param=f"{where}.{name}"
            )


def no_tools(tools: Any, choice: Any, where: str, event_id: str | None) -> None:
    """Tools offered are refused, not ignored (as on chat completions): no omnictl terminal
    produces tool calls. An empty list and ``auto`` / ``none`` (what clients send by
    default) ask for nothing and pass."""
    refuse = ev.Refusal(event_id)
    if tools is not msgspec.UNSET and tools:
        raise refuse(
            f"{where}.tools: this topology cannot call tools (no stage produces tool calls); send no tools",
            param=f"{where}.tools",
        )
    if choice is not msgspec.UNSET and choice not in ("auto", "none"):
        raise refuse(
            f"{where}.tool_choice {clip_repr(choice)}: this topology cannot call tools; only 'auto' or 'none'",
            param=f"{where}.tool_choice",
        )
