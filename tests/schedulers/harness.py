"""Helpers for driving schedulers through their inbox/outbox in asyncio tests."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.profiling.events import EventKind, MetaValue
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, Scheduler
from omnictl.schedulers.runner import StepOutput


@dataclass
class Outcome:
    chunks: list[Any] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    errors: list[str] = field(default_factory=list)  # every error seen, to catch duplicates

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


def new_request(rid: str, data: Any, **sampling: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.NEW_REQUEST, rid, data, params={"sampling": sampling})


async def pump(scheduler: Scheduler, outcomes: dict[str, Outcome], until: Any, timeout: float = 30.0) -> None:
    """Move outbox messages into ``outcomes`` until ``until()`` is true (or fail at the deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not until():
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"deadline passed; outcomes so far: { {k: (len(v.chunks), v.done) for k, v in outcomes.items()} }")
        try:
            message = await asyncio.wait_for(scheduler.outbox.get(), timeout=min(remaining, 0.2))
        except asyncio.TimeoutError:
            continue
        outcome = outcomes.setdefault(message.request_id, Outcome())
        if message.kind is OutgoingKind.STREAM:
            outcome.chunks.append(message.data)
        elif message.kind is OutgoingKind.RESULT:
            outcome.result = message.data
        else:
            outcome.error = message.error
            outcome.errors.append(message.error or "")


async def wait_for_condition(condition: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)  # yields to the loop while polling; the deadline bounds the wait


class RecordingProfiler:
    def __init__(self) -> None:
        self.events: list[tuple[EventKind, str, dict[str, MetaValue]]] = []
        self._lock = threading.Lock()

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: MetaValue) -> None:
        with self._lock:
            self.events.append((kind, request_id, meta))


class GatedRunner:
    """Test double around a real runner: records each decode batch and can hold decode call n.

    Holding the worker inside a decode call lets a test submit a request at a known step.
    """

    def __init__(self, inner: HFCausalLMRunner) -> None:
        self.inner = inner
        self.batches: list[tuple[str, ...]] = []
        self.arrived: dict[int, threading.Event] = {}
        self.gates: dict[int, threading.Event] = {}

    def hold(self, call_index: int) -> None:
        self.arrived[call_index] = threading.Event()
        self.gates[call_index] = threading.Event()

    def prefill(self, request_id: str, inputs: Any) -> StepOutput:
        return self.inner.prefill(request_id, inputs)

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        index = len(self.batches)
        self.batches.append(tuple(request_ids))
        if index in self.gates:
            self.arrived[index].set()
            if not self.gates[index].wait(timeout=30):
                raise TimeoutError(f"gate {index} never opened")
        return self.inner.decode(request_ids, token_ids)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)

    def stop_token_ids(self) -> set[int]:
        return self.inner.stop_token_ids()

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.inner.detokenize(token_ids)

    def kv_slots(self) -> int:
        return self.inner.kv_slots()
