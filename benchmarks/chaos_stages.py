"""The chaos soak's stages: plain functions in replicated processes, and a payload that
checks itself, so that a slot handed out twice (or read after reuse) shows as a wrong answer.

``front`` (the entry) reads "chaos N: w1 w2 ..." and sends the words with a float32 array
filled with N (256 KiB: through a shared-memory slot) to ``answer`` and ``speak``, which run
in another process. ``answer`` is autoregressive (the text terminal): greedy and certain, its
next token is always the next byte of "echo: w1 w2 ...", so a stream cut by a killed replica
and resumed elsewhere with the tokens its caller has forced must join to exactly that text; it
checks the array still holds N first. ``speak`` streams one short tone per word (audio terminal).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator, Mapping, Sequence

import numpy as np

from omnictl.inputs import TextPart, as_chat_request
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.schedulers.runner import StepOutput

RATE = 16_000
FEATURES = 64 * 1024  # float32 elements: 256 KiB, over the inline limit, so it travels in shared memory
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


def echo_text(words: list[str]) -> str:
    """What ``answer`` says to ``words``, the clean greedy text a resumed stream must equal."""
    return " ".join(["echo:", *words])


class _EchoRunner:
    """Byte tokens; the next one is always the next byte of the request's answer (its logits
    one finite score: greedy whatever the sampling), then the stop token. ``token_s`` per
    decode step stands in for a forward pass (the GIL is released)."""

    STOP = 256

    def __init__(self, token_s: float) -> None:
        self.token_s = token_s
        self._answers: dict[str, tuple[list[int], list[int]]] = {}  # request -> (answer bytes, [position])

    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> Any:
        _check(dict(inputs))
        answer = list(echo_text(list(inputs["words"])).encode())
        self._answers[request_id] = (answer, [0])
        return StepOutput(logits=self._next(request_id), prompt_tokens=len(inputs["words"]))

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[Any]:
        time.sleep(self.token_s)
        return [StepOutput(logits=self._next(rid)) for rid in request_ids]

    def _next(self, request_id: str) -> Any:
        import torch

        answer, position = self._answers[request_id]
        token = answer[position[0]] if position[0] < len(answer) else self.STOP
        position[0] += 1
        logits = torch.full((self.STOP + 1,), float("-inf"))
        logits[token] = 0.0
        return logits

    def release(self, request_id: str) -> None:
        self._answers.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {self.STOP}

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def kv_slots(self) -> int:
        return len(self._answers)


def answer(token_s: float = 0.003, stream_every: int = 3) -> Any:
    """The text terminal: an :class:`AutoregressiveScheduler` over :class:`_EchoRunner`
    (about 40 tokens, ``token_s`` each, a chunk every ``stream_every``)."""
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

    return AutoregressiveScheduler(_EchoRunner(token_s), stream_every=stream_every)


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
