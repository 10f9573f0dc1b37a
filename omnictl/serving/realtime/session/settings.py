"""A realtime session's settings, and the checks a value must pass to become one.

The ranges are the OpenAI Realtime protocol's; a value outside one is refused with an
``error`` event naming its field (:func:`in_range`), before anything of the update that
carried it is applied (:mod:`.configure`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from omnictl.sampling import SamplingParams
from omnictl.serving.common.echo import clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import PCM, AudioCodec

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


def max_tokens(value: int | str, param: str, event_id: str | None) -> int | str:
    """A positive integer or ``"inf"``; else the error naming ``param``."""
    if value != "inf" and (not isinstance(value, int) or value < 1):
        raise ev.Refusal(event_id)(f"{param} must be a positive integer or 'inf', got {value!r}", param=param)
    return value


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
