"""The OpenTelemetry tests' stages: ``front`` takes every kind of request (a chat request, a
speech request, a transcription's audio) and routes it; ``hear`` reports how much audio it
got as the transcript; the text and audio terminals are the fast HTTP tests' ones."""

from __future__ import annotations

from typing import Any, Callable

from omnictl.inputs import AudioPart, SpeechRequest, TextPart, as_chat_request
from omnictl.outputs import Transcript


def front() -> Callable[[Any], dict[str, Any]]:
    def run(data: Any) -> dict[str, Any]:
        if isinstance(data, SpeechRequest):
            return {"words": data.text.split(), "slow": False, "prompt_tokens": 0, "speak": True}
        message = as_chat_request(data).last_user_message()
        parts = message.parts if message is not None else []
        samples = sum(part.samples.size for part in parts if isinstance(part, AudioPart))
        words = [word for part in parts if isinstance(part, TextPart) for word in part.text.split()]
        if "explode" in words:
            raise RuntimeError("front exploded on purpose")
        return {"words": ["echo:", *words], "slow": False, "prompt_tokens": len(words), "samples": samples}

    return run


def route(data: dict[str, Any]) -> list[str]:
    """Speech goes to the audio terminal alone; the rest everywhere the request runs."""
    return ["speak"] if data.get("speak") else ["answer", "speak", "hear"]


def hear() -> Callable[[dict[str, Any]], Transcript]:
    def run(data: dict[str, Any]) -> Transcript:
        return Transcript(text=f"{data['samples']} samples")

    return run
