"""The chaos soak's stages: plain functions in replicated processes, and a payload that
checks itself, so that a slot handed out twice (or read after reuse) shows as a wrong answer.

``front`` (the entry) reads "chaos N: w1 w2 ..." and sends the words with a float32 array
filled with N (256 KiB: through a shared-memory slot) to ``answer`` and ``speak``, which run
in another process. ``answer`` streams "echo: w1 w2 ..." word by word (text terminal) after
checking the array still holds N; ``speak`` streams one short tone per word (audio terminal).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

import numpy as np

from omnictl.inputs import TextPart, as_chat_request
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult

RATE = 16_000
FEATURES = 64 * 1024  # float32 elements: 256 KiB, over the inline limit, so it travels in shared memory
TextStream = Generator[TextDelta, None, TextResult]
AudioStream = Generator[AudioChunk, None, AudioResult]


def front() -> Callable[[Any], dict[str, Any]]:
    def run(data: Any) -> dict[str, Any]:
        message = as_chat_request(data).last_user_message()
        text = " ".join(p.text for p in (message.parts if message else ()) if isinstance(p, TextPart))
        head, _, rest = text.partition(":")
        number = int(head.split()[-1])
        return {"number": number, "words": rest.split(), "features": np.full(FEATURES, number, dtype=np.float32)}

    return run


def _check(data: dict[str, Any]) -> None:
    features = data["features"]
    if features.shape != (FEATURES,) or not np.all(features == data["number"]):
        raise RuntimeError(f"request {data['number']}: its payload was overwritten in transit")


def answer(word_s: float = 0.01) -> Callable[[dict[str, Any]], TextStream]:
    def run(data: dict[str, Any]) -> TextStream:
        _check(data)
        words = ["echo:", *data["words"]]
        for index, word in enumerate(words):
            time.sleep(word_s)  # stands in for a decode step (the GIL is released)
            yield TextDelta(text=word if index == 0 else " " + word)
        return TextResult(text=" ".join(words), completion_tokens=len(words))

    return run


def speak(word_s: float = 0.01) -> Callable[[dict[str, Any]], AudioStream]:
    def run(data: dict[str, Any]) -> AudioStream:
        _check(data)
        chunks = []
        for word in data["words"]:
            time.sleep(word_s)
            t = np.arange(int(0.05 * RATE)) / RATE
            chunk = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
            chunks.append(chunk)
            yield AudioChunk(samples=chunk, sample_rate=RATE, transcript=word + " ")
        return AudioResult(samples=np.concatenate(chunks), sample_rate=RATE, transcript=" ".join(data["words"]))

    return run
