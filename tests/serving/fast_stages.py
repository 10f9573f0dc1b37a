"""Fast plain-function stages for the HTTP tests: a real pipeline with no model in it.

``prep`` reads the last user message (text, or a note about its audio) and fails on
the word "explode"; ``speak`` sends a chunk that is not audio for the word "garble"; ``answer`` streams "echo: <question>" word by word as the text
terminal; ``speak`` streams one short tone per word as the audio terminal. The word
"slowly" makes both terminals wait between chunks, so a test can leave mid-request.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

import numpy as np

from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult

RATE = 16_000
SLOW_CHUNK_S = 0.3
SLOW_WORDS = 40
TextStream = Generator[TextDelta, None, TextResult]  # chunks, then the result
AudioStream = Generator[Any, None, AudioResult]


def _question(data: dict[str, Any]) -> str:
    content = [m for m in data["messages"] if m.get("role") == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    words = []
    for part in content:
        if part["type"] == "text":
            words.append(part["text"])
        elif part["type"] == "input_audio":
            words.append(f"audio({len(part['input_audio']['data'])} base64 chars)")
    return " ".join(words)


def prep() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        question = _question(data)
        if "explode" in question:
            raise RuntimeError("prep exploded on purpose")
        words = ["echo:", *question.split()]
        if "slowly" in question:
            words += ["and"] * SLOW_WORDS
        max_tokens = data.get("sampling", {}).get("max_tokens")
        return {"words": words[:max_tokens] if max_tokens else words, "slow": "slowly" in question,
                "prompt_tokens": len(question.split())}

    return run


def answer() -> Callable[[dict[str, Any]], TextStream]:
    def run(data: dict[str, Any]) -> TextStream:
        words = list(data["words"])
        for index, word in enumerate(words):
            if data["slow"]:
                time.sleep(SLOW_CHUNK_S)
            yield TextDelta(text=word if index == 0 else " " + word)
        return TextResult(text=" ".join(words), prompt_tokens=data["prompt_tokens"], completion_tokens=len(words))

    return run


def tone(seconds: float, frequency: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def speak() -> Callable[[dict[str, Any]], AudioStream]:
    def run(data: dict[str, Any]) -> AudioStream:
        chunks = []
        for word in data["words"]:
            if data["slow"]:
                time.sleep(SLOW_CHUNK_S)
            if word == "garble":  # breaks the audio terminal contract: a dict, not an AudioChunk
                yield {"audio": "static", "sample_rate": RATE, "transcript": word}
                continue
            chunk = tone(0.1)
            chunks.append(chunk)
            yield AudioChunk(samples=chunk, sample_rate=RATE, transcript=word + " ")
        return AudioResult(samples=np.concatenate(chunks), sample_rate=RATE, transcript=" ".join(data["words"]))

    return run
