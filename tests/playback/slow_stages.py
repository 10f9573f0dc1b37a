"""Stages for the deadline end-to-end test: text streamed word by word into the voice
assistant's sentence TTS scheduler, whose speaker is slowed on purpose (0.3 s a sentence)."""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

import numpy as np

from omnictl.models.voice_assistant.speech_scheduler import SentenceSpeechScheduler
from omnictl.outputs import TextDelta, TextResult


class SlowSpeaker:
    """A test double for Piper: 0.3 s to 'synthesise' 5 s of silence per sentence."""

    sample_rate = 16_000

    def synthesize(self, text: str, speed: float = 1.0) -> np.ndarray:
        time.sleep(0.3)
        return np.zeros(5 * self.sample_rate, dtype=np.float32)


def words() -> Callable[[Any], Generator[TextDelta, None, TextResult]]:
    def run(data: Any) -> Generator[TextDelta, None, TextResult]:
        text = str(data["text"])
        for word in text.split(" "):
            yield TextDelta(text=word + " ")
        return TextResult(text=text)

    return run


def slow_tts(audio_policy: str = "fifo") -> SentenceSpeechScheduler:
    speaker = SlowSpeaker()
    return SentenceSpeechScheduler(speaker_factory=lambda voice: speaker, audio_policy=audio_policy)  # type: ignore[arg-type,return-value]
