"""A scripted pipeline: the one test double of the in-process route tests.

The routes, the admission, the tracking and the metrics under test are the real ones,
run in the test process (where mutation testing sees them) behind a real ASGI client;
only the pipeline answers from a script: the events its requests yield are real
:class:`~omnictl.coordinator.request.RequestEvent` s carrying real :mod:`omnictl.outputs`,
and its topology is a real one (``tests/serving/slow.yaml`` serves every endpoint).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

import numpy as np

from omnictl.admission import Admission
from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.topology.validation import load

if TYPE_CHECKING:
    from omnictl.serving.common.tracking import Tracked
    from omnictl.serving.state import ServingState

HERE = Path(__file__).parent
EVERY_ENDPOINT = load(HERE / "slow.yaml")  # chat, realtime, speech, transcriptions
CHAT_ONLY = load(HERE / "fast.yaml")  # chat and realtime only
RATE = 16_000


def text_events(words: list[str], stage: str = "answer") -> list[RequestEvent]:
    """A text terminal streaming ``words`` (a space after each but the last), then its result."""
    deltas = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    events = [RequestEvent(RequestEventKind.STREAM, stage, TextDelta(d)) for d in deltas]
    return events + [RequestEvent(RequestEventKind.RESULT, stage, TextResult("".join(deltas)))]


def tone(seconds: float = 0.05, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def audio_events(chunks: int = 2, stage: str = "speak", seconds: float = 0.05) -> list[RequestEvent]:
    """An audio terminal streaming ``chunks`` tones, then the whole as its result."""
    parts = [tone(seconds) for _ in range(chunks)]
    events = [RequestEvent(RequestEventKind.STREAM, stage, AudioChunk(p, RATE)) for p in parts]
    return events + [RequestEvent(RequestEventKind.RESULT, stage, AudioResult(np.concatenate(parts), RATE))]


def error_event(message: str, stage: str | None = "answer", field: str | None = None) -> RequestEvent:
    return RequestEvent(RequestEventKind.ERROR, stage, error=message, field=field)


Script = Callable[[Any, list[str]], list[RequestEvent]]


@dataclass
class ScriptedRequest:
    id: str
    script: list[RequestEvent]
    hold: bool  # after the script, wait until aborted (a request still running)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)

    async def events(self) -> AsyncIterator[RequestEvent]:
        for event in self.script:
            if self.aborted.is_set():
                break
            yield event
            await asyncio.sleep(0)
        else:
            if not self.hold:
                return
            await self.aborted.wait()
        yield RequestEvent(RequestEventKind.ABORTED, None)


class ScriptedPipeline:
    """Answers each submit with ``script(inputs, modalities)``; records submits and aborts."""

    run_dir = None
    healthy = True
    replayed = 0
    resumed = 0
    standby: dict[str, Any] = {}

    def __init__(self, topology: Any = EVERY_ENDPOINT, script: Script | None = None, hold: bool = False,
                 admission: Admission | None = None) -> None:
        self.topology = topology
        self.script: Script = script or (lambda inputs, modalities: text_events(["echo:", "hi"]))
        self.hold = hold
        self.admission = admission or Admission(max_in_flight=None)
        self.submitted: list[tuple[Any, list[str] | None, str | None, str | None, bool]] = []
        self.requests: dict[str, ScriptedRequest] = {}
        self.aborts: list[str] = []
        self.refuse: Exception | None = None  # raised by the next submit
        self.stage_stats: dict[str, dict[str, Any]] = {"answer": {"status": "up", "process": "heads"}}
        self.health_status: tuple[str, dict[str, str]] = ("ok", {})
        self.avoided: list[list[str]] = []

    async def submit(self, inputs: Any, modalities: list[str] | None = None, request_id: str | None = None,
                     traceparent: str | None = None, stream: bool = True) -> ScriptedRequest:
        self.submitted.append((inputs, modalities, request_id, traceparent, stream))
        if self.refuse is not None:
            raise self.refuse
        request = ScriptedRequest(request_id or f"req-{len(self.submitted)}", self.script(inputs, modalities or []),
                                  self.hold)
        self.requests[request.id] = request
        return request

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)
        if request_id in self.requests:
            self.requests[request_id].aborted.set()

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        return self.stage_stats

    def avoid(self, processes: list[str]) -> None:
        self.avoided.append(list(processes))

    def in_flight(self) -> int:
        return sum(1 for r in self.requests.values() if not r.aborted.is_set())

    def health(self) -> tuple[str, dict[str, str]]:
        return self.health_status

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {"-": {"status": "up"}}

    def process_ids(self) -> dict[str, int]:
        return {"heads": 4242}

    def scaling(self) -> dict[str, Any]:
        return {}


def end_in_flight_soon(state: ServingState, pipeline: ScriptedPipeline, reason: str) -> Callable[[], Awaitable[None]]:
    """A task for the test client's portal: once a request is in flight, the server ends it
    with ``reason``, as it does on shutdown."""
    from omnictl.serving.common.tracking import end_in_flight

    async def end() -> None:
        while not state.active:
            await asyncio.sleep(0.001)
        await end_in_flight(state.active, pipeline.abort, reason)

    return end


def behind_stream(state: ServingState, outcome: str | None = None) -> Tracked:
    """A playing stream whose chunks come 4 s apart, each 0.1 s long: one more stream would
    make its listener wait ~7.9 s."""
    from omnictl.serving.common.tracking import Tracked

    tracked = Tracked(ScriptedRequest("playing", [], False), state.metrics, state.active)
    tracked.plays("/v1/audio/speech")
    assert tracked.playback is not None
    now = time.perf_counter()
    tracked.playback.start = now - 10
    tracked.playback.chunk(now - 9, 0.1)
    tracked.playback.chunk(now - 5, 0.1)
    tracked.outcome = outcome
    state.active["playing"] = tracked
    return tracked
