"""Fast plain-function stages for the HTTP tests: a real pipeline with no model in it.

``prep`` takes the server's typed request and reads its last user message (text, or a
note about its audio) and fails on
the word "explode"; ``speak`` sends a chunk that is not audio for the word "garble"; ``answer`` streams "echo: <question>" word by word as the text
terminal; ``speak`` streams one short tone per word as the audio terminal. The word
"slowly" makes both terminals wait between chunks, so a test can leave mid-request.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

import numpy as np

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import AudioPart, ChatRequest, ImagePart, TextPart, as_chat_request
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult

RATE = 16_000
SLOW_CHUNK_S = 0.3
SLOW_WORDS = 40
TextStream = Generator[TextDelta, None, TextResult]  # chunks, then the result
AudioStream = Generator[Any, None, AudioResult]


def _question(request: ChatRequest) -> str:
    message = request.last_user_message()
    words = []
    for part in message.parts if message is not None else ():
        if isinstance(part, TextPart):
            words.append(part.text)
        elif isinstance(part, AudioPart):  # decoded by the server: samples, not base64
            words.append(f"audio({part.samples.size} samples at {part.sample_rate} Hz)")
    return " ".join(words)


def prep() -> Callable[[Any], dict[str, Any]]:
    def run(data: Any) -> dict[str, Any]:
        request = as_chat_request(data)
        for part in request.messages[-1].parts:
            if isinstance(part, ImagePart):  # as the voice assistant: the input is the client's mistake
                raise InvalidRequest(f"{part.field}: this topology does not take images", field=part.field)
        question = _question(request)
        if "explode" in question:
            raise RuntimeError("prep exploded on purpose")
        words = ["echo:", *question.split()]
        if "slowly" in question:
            words += ["and"] * SLOW_WORDS
        max_tokens = request.sampling.max_tokens
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
