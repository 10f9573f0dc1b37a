"""Stages that say which OS process handled each message: for replica placement tests.

Every message a stage here gets is stamped with ``os.getpid()``, so a test can check that
all parts and chunks of one request reached one replica.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator

from omnictl.schedulers.base import IncomingKind, OutgoingKind, OutgoingMessage, Scheduler, SchedulerLoad
from omnictl.schedulers.runner import StepOutput


def tokens(count: int = 4, delay: float = 0.0) -> Callable[[dict[str, Any]], Iterator[dict[str, Any]]]:
    """Streams ``count`` chunks, then returns the request's data."""

    def run(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for i in range(count):
            if delay:
                time.sleep(delay)
            yield {"token": i}
        return {"tag": data["tag"], "pid": {"source": os.getpid()}}

    return run


class PidCollector(Scheduler):
    """Consumes the chunks streamed to it, recording the pid that received each one; on the
    upstream's data, returns the chunks and their pids beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: dict[str, list[tuple[int, int]]] = {}

    async def run(self) -> None:
        while True:
            message = await self.inbox.get()
            if message.kind is IncomingKind.STREAM_CHUNK:
                self.chunks.setdefault(message.request_id, []).append((message.data["token"], os.getpid()))
            elif message.kind is IncomingKind.NEW_REQUEST:
                got = self.chunks.pop(message.request_id, [])
                result = {**message.data, "streamed": [t for t, _ in got], "chunk_pids": [p for _, p in got],
                          "collect_pid": os.getpid()}
                self.emit(OutgoingMessage(OutgoingKind.RESULT, message.request_id, result))

    def abort(self, request_id: str) -> None:
        self.chunks.pop(request_id, None)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(stream_buffers=len(self.chunks))


def pid_collector() -> PidCollector:
    return PidCollector()


def side() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {"tag": data["tag"], "side_pid": os.getpid()}

    return run


def merge_with_pid(inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fan-in: runs where the parts met, so its pid is the replica that got them all."""
    return {**inputs["collect"], "side_pid": inputs["side"]["side_pid"], "join_pid": os.getpid()}


def pid_after(seconds: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Holds each request for ``seconds`` (GIL released), then stamps its pid."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        time.sleep(seconds)
        return {**data, "work_pid": os.getpid()}

    return run


def pid_after_logged(seconds: float, log: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """As :func:`pid_after`, and appends "i pid" to the file ``log`` as each request starts:
    what ran where, however many times (a request moved between replicas must run once)."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        with open(log, "a") as out:
            out.write(f"{data['i']} {os.getpid()}\n")
        time.sleep(seconds)
        return {**data, "work_pid": os.getpid()}

    return run


def pid_after_asked(seconds: float = 0.1) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Holds each request for its ``seconds`` (default ``seconds``), then stamps its pid."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        time.sleep(float(data.get("seconds", seconds)))
        return {**data, "work_pid": os.getpid()}

    return run


class _EchoRunner:
    """An autoregressive runner whose next token is always the prompt's next byte (greedy:
    certain), taking ``delay`` seconds per decode step: a deterministic text stream slow
    enough to kill its replica in the middle of it."""

    EOS = 256

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._caches: dict[str, list[int]] = {}  # request -> [position, *prompt]

    def prefill(self, request_id: str, inputs: Any) -> Any:
        cache = self._caches[request_id] = [0, *inputs["prompt"]]
        return StepOutput(logits=self._next(cache), prompt_tokens=len(cache) - 1)

    def decode(self, request_ids: Any, token_ids: Any) -> list[Any]:
        time.sleep(self.delay)
        return [StepOutput(logits=self._next(self._caches[rid])) for rid in request_ids]

    def _next(self, cache: list[int]) -> Any:
        import torch

        position = cache[0] = cache[0] + 1
        token = cache[position] if position < len(cache) else self.EOS
        logits = torch.full((self.EOS + 1,), float("-inf"))
        logits[token] = 0.0
        return logits

    def release(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {self.EOS}

    def detokenize(self, token_ids: Any) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def kv_slots(self) -> int:
        return len(self._caches)


def slow_echo(delay: float = 0.01, stream_every: int = 2) -> Any:
    """An autoregressive text terminal repeating ``data["prompt"]`` (byte ids), ``delay`` s a token."""
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

    return AutoregressiveScheduler(_EchoRunner(delay), stream_every=stream_every)
