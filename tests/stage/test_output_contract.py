"""A text/audio terminal's outputs are checked against its modality by the Stage itself:
a wrong shape fails that request, naming the stage, and the stage keeps serving others."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import numpy as np

from omnictl.messages import RequestContext
from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.profiling.events import NullProfiler
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Stage
from omnictl.topology.model import StageSpec


class TerminalPorts:
    """Collects what a terminal stage reports to the coordinator."""

    def __init__(self, expected: int) -> None:
        self.outputs: list[tuple[str, bool, Any]] = []
        self.failures: list[tuple[str, str]] = []
        self.expected = expected
        self.done = asyncio.Event()

    def _ended(self) -> None:
        finished = len(self.failures) + sum(final for _, final, _ in self.outputs)
        if finished >= self.expected:
            self.done.set()

    def send_terminal(self, request_id: str, stage: str, final: bool, seq: int, data: Any) -> None:
        self.outputs.append((request_id, final, data))
        self._ended()

    def send_failure(self, request_id: str, stage: str, error: str, field: str | None = None) -> None:
        self.failures.append((request_id, error))
        self._ended()

    def send_data(self, *args: Any) -> None: ...
    def send_stream(self, *args: Any) -> None: ...
    def send_stream_done(self, *args: Any) -> None: ...
    def send_skip(self, *args: Any) -> None: ...
    def send_terminal_skipped(self, *args: Any) -> None: ...


def run_terminal(modality: str, stage_fn: Any, inputs: dict[str, Any]) -> TerminalPorts:
    """Feed each request id its input through a terminal stage; wait until all ended."""
    spec = StageSpec(name="speaker", factory="x.y", terminal=True, modality=modality)
    ports = TerminalPorts(expected=len(inputs))

    async def go() -> None:
        stage = Stage(spec, SimpleScheduler(stage_fn), FanIn((), None), Router(spec, None, {}), ports, NullProfiler())  # type: ignore[arg-type]
        await stage.start()
        for rid, data in inputs.items():
            stage.on_input(RequestContext(rid, {}, ("speaker",)), None, data)
        await asyncio.wait_for(ports.done.wait(), 5)
        await stage.stop()

    asyncio.run(go())
    return ports


def test_a_text_terminal_returning_a_dict_fails_that_request_naming_the_stage() -> None:
    def answer(data: dict[str, Any]) -> Any:
        return {"answer": "42"} if data["bad"] else TextResult(text="fine")

    ports = run_terminal("text", answer, {"bad": {"bad": True}, "good": {"bad": False}})
    assert len(ports.failures) == 1
    rid, error = ports.failures[0]
    assert rid == "bad"
    assert "stage 'speaker'" in error and "'text' terminal's result" in error
    assert "TextResult" in error and "['answer']" in error
    assert [(r, final) for r, final, _ in ports.outputs] == [("good", True)]


def test_an_audio_terminal_streaming_text_fails_at_the_chunk_and_sends_nothing_after() -> None:
    tone = np.zeros(160, dtype=np.float32)

    def speak(data: dict[str, Any]) -> Iterator[Any]:
        yield AudioChunk(samples=tone, sample_rate=16_000)
        if data["bad"]:
            yield TextDelta(text="not audio")
        return AudioResult(samples=np.concatenate([tone, tone]), sample_rate=16_000)

    ports = run_terminal("audio", speak, {"bad": {"bad": True}, "good": {"bad": False}})
    assert [rid for rid, _ in ports.failures] == ["bad"]
    assert "'audio' terminal's stream chunk must be omnictl.outputs.AudioChunk, got TextDelta" in ports.failures[0][1]
    bad_outputs = [final for rid, final, _ in ports.outputs if rid == "bad"]
    assert bad_outputs == [False]  # the good first chunk went out; no result after the failure
    good = [data for rid, final, data in ports.outputs if rid == "good" and final]
    assert isinstance(good[0], AudioResult) and good[0].samples.size == 320


def test_a_free_form_modality_passes_any_data() -> None:
    ports = run_terminal("video", lambda data: {"frames": 3}, {"r": {}})
    assert ports.failures == [] and ports.outputs == [("r", True, {"frames": 3})]
