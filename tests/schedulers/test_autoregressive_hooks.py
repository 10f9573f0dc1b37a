"""The autoregressive scheduler's public hooks, which model schedulers (thinker, talker) extend it by."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Mapping, Sequence

import pytest

from omnictl.exceptions import InvalidRequest
from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.schedulers.autoregressive import AutoregressiveScheduler, StartOn
from omnictl.schedulers.base import IncomingKind, IncomingMessage
from omnictl.schedulers.runner import StepOutput
from omnictl.schedulers.sampling import SamplingParams
from tests.schedulers.harness import GatedRunner, Outcome, new_request, pump
from tests.support.wait import run


class Hooked(AutoregressiveScheduler):
    """Records every hook call; keeps only a request's ``max_tokens``, wraps outputs, can fail one."""

    def __init__(self, runner: Any, **kwargs: Any) -> None:
        super().__init__(runner, default_sampling={"temperature": 0, "max_tokens": 2}, **kwargs)
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_output_of: str | None = None
        self.threads: set[str] = set()

    def request_sampling(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        requested = params.get("sampling") or {}
        return {"max_tokens": requested.get("max_tokens")}  # the request's temperature is ignored here

    def on_start(self, request_id: str, sampling: SamplingParams) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("start", request_id, sampling))

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        self.threads.add(threading.current_thread().name)
        if request_id == self.fail_output_of:
            raise RuntimeError("no outputs for this one")
        self.calls.append(("output", request_id, final))
        return ("wrapped", final, data)

    def on_drop(self, request_id: str) -> None:
        self.calls.append(("drop", request_id, None))


def test_hooks_choose_sampling_shape_outputs_and_hear_of_drops(runner: HFCausalLMRunner) -> None:
    async def scenario() -> tuple[Hooked, dict[str, Outcome]]:
        scheduler = Hooked(runner)
        scheduler.fail_output_of = "broken"
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("ok", {"prompt": "hi"}, max_tokens=3, temperature=1.5))
            scheduler.inbox.put_nowait(new_request("broken", {"prompt": "hi"}))
            await pump(scheduler, outcomes, lambda: all(r in outcomes and outcomes[r].done for r in ("ok", "broken")))
            return scheduler, outcomes
        finally:
            await scheduler.stop()

    scheduler, outcomes = run(scenario(), timeout=120)
    ok = outcomes["ok"]
    assert [chunk[:2] for chunk in ok.chunks] == [("wrapped", False)] * 3
    assert ok.result[:2] == ("wrapped", True)
    starts = {rid: sampling for kind, rid, sampling in scheduler.calls if kind == "start"}
    assert starts["ok"].max_tokens == 3 and starts["ok"].temperature == 0.0  # request's max_tokens over the default
    assert starts["broken"].max_tokens == 2  # the default
    # The result's on_output comes last, and only for requests that got one.
    assert [c for c in scheduler.calls if c[1] == "ok"][-1] == ("output", "ok", True)
    assert ("drop", "ok", None) not in scheduler.calls
    # A hook that raises fails its request only, naming the cause; on_drop cleans up.
    assert "no outputs for this one" in (outcomes["broken"].error or "")
    assert ("drop", "broken", None) in scheduler.calls
    assert scheduler.threads == {"ar-worker"}  # the model-side hooks run on the worker thread
    assert runner.kv_slots() == 0


def test_an_abort_reaches_on_drop_and_a_bad_request_sampling_is_refused(runner: HFCausalLMRunner) -> None:
    gated = GatedRunner(runner)
    gated.hold(0)  # the first decode step waits, so the abort lands mid-request

    async def scenario() -> tuple[Hooked, dict[str, Outcome]]:
        scheduler = Hooked(gated)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("bad", {"prompt": "hi"}, max_tokens=0))
            scheduler.inbox.put_nowait(new_request("held", {"prompt": "hi"}, max_tokens=5))
            await asyncio.to_thread(gated.arrived[0].wait, 30)
            scheduler.abort("held")
            gated.gates[0].set()
            await pump(scheduler, outcomes, lambda: "bad" in outcomes and outcomes["bad"].done and scheduler.load().running == 0)
            return scheduler, outcomes
        finally:
            await scheduler.stop()

    scheduler, outcomes = run(scenario(), timeout=120)
    assert "sampling.max_tokens" in (outcomes["bad"].error or "")
    assert not any(rid == "bad" for _, rid, _ in scheduler.calls)  # refused before it started
    assert ("drop", "held", None) in scheduler.calls
    assert "held" not in outcomes or outcomes["held"].result is None
    assert runner.kv_slots() == 0


def test_construction_checks_start_on_and_default_sampling_once(runner: HFCausalLMRunner) -> None:
    assert AutoregressiveScheduler(runner, start_on="stream").start_on is StartOn.STREAM
    assert AutoregressiveScheduler(runner).start_on == "request"  # a str enum: the plain strings still compare
    with pytest.raises(ValueError, match="start_on"):
        AutoregressiveScheduler(runner, start_on="later")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="default_sampling.top_p"):
        AutoregressiveScheduler(runner, default_sampling={"top_p": 0})
    assert not hasattr(AutoregressiveScheduler(runner), "default_sampling")  # the one copy is private


class FeedLog(GatedRunner):
    """A stream-fed runner: prefills from the token ids fed to it, once the upstream is done."""

    def __init__(self, inner: HFCausalLMRunner) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, Any, bool]] = []
        self.tokens: dict[str, list[int]] = {}
        self.done: set[str] = set()

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        self.log.append((request_id, data, done))
        if isinstance(data, Mapping):
            self.tokens.setdefault(request_id, []).extend(data["token_ids"])
        if done:
            self.done.add(request_id)

    def ready(self, request_id: str) -> bool:
        return request_id in self.done

    def prefill(self, request_id: str, inputs: Any) -> StepOutput:
        return super().prefill(request_id, {"input_ids": self.tokens[request_id]})

    def release(self, request_id: str) -> None:
        self.tokens.pop(request_id, None)
        self.done.discard(request_id)
        super().release(request_id)

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        return super().decode(request_ids, token_ids)


def test_in_stream_mode_a_result_that_comes_first_starts_the_request_and_is_its_last_increment(
    runner: HFCausalLMRunner,
) -> None:
    fed = FeedLog(runner)
    upstream = {"token_ids": [11, 12, 13]}

    async def scenario() -> tuple[Hooked, dict[str, Outcome]]:
        scheduler = Hooked(fed, start_on="stream")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", upstream, params={}))
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            return scheduler, outcomes
        finally:
            await scheduler.stop()

    scheduler, outcomes = run(scenario(), timeout=120)
    assert outcomes["r"].result is not None, outcomes["r"].error
    assert fed.log == [("r", upstream, True)]
    assert scheduler.calls[0][:2] == ("start", "r")  # on_start comes before anything is fed
