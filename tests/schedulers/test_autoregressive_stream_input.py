"""The autoregressive scheduler fed by an upstream stream (the talker over the thinker's output)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Sequence

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.schedulers.autoregressive import AutoregressiveScheduler, StreamFedRunner
from omnictl.schedulers.base import IncomingKind, IncomingMessage
from omnictl.schedulers.runner import StepOutput
from tests.schedulers.harness import Outcome, pump

PROMPT_UNITS = 2  # the talker prefills once this many upstream tokens arrived


class ConditionedRunner:
    """Test double shaped like a talker: step i reads the upstream's token i when it has one.

    Wraps a real runner; waits (``ready`` is False) while the upstream has not produced
    the token the next step needs. Its output depends only on the upstream's tokens, not
    on when they arrive, which is what the test checks.
    """

    def __init__(self, inner: HFCausalLMRunner) -> None:
        self.inner = inner
        self.fed: dict[str, list[int]] = {}
        self.done: set[str] = set()
        self.consumed: dict[str, int] = {}
        self.waiting = threading.Event()  # set whenever a started request had to wait

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        if data is not None and not done:
            self.fed.setdefault(request_id, []).extend(data["token_ids"])
        if done:
            self.done.add(request_id)

    def ready(self, request_id: str) -> bool:
        have = len(self.fed.get(request_id, []))
        if request_id not in self.consumed:
            return have >= PROMPT_UNITS or (request_id in self.done and have > 0)
        ok = self.consumed[request_id] < have or request_id in self.done
        if not ok:
            self.waiting.set()
        return ok

    def prefill(self, request_id: str, inputs: Any) -> StepOutput:
        prompt = self.fed[request_id][:PROMPT_UNITS]
        self.consumed[request_id] = len(prompt)
        return self.inner.prefill(request_id, {"input_ids": prompt})

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        inputs = []
        for rid, sampled in zip(request_ids, token_ids):
            upstream = self.fed[rid]
            if self.consumed[rid] < len(upstream):
                inputs.append(upstream[self.consumed[rid]])
                self.consumed[rid] += 1
            else:
                inputs.append(sampled)
        return self.inner.decode(request_ids, inputs)

    def release(self, request_id: str) -> None:
        self.fed.pop(request_id, None)
        self.done.discard(request_id)
        self.consumed.pop(request_id, None)
        self.inner.release(request_id)

    def stop_token_ids(self) -> set[int]:
        return self.inner.stop_token_ids()

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.inner.detokenize(token_ids)

    def kv_slots(self) -> int:
        return self.inner.kv_slots()


def stream_chunk(rid: str, tokens: list[int], max_tokens: int = 8) -> IncomingMessage:
    return IncomingMessage(
        IncomingKind.STREAM_CHUNK, rid, {"token_ids": tokens}, source="thinker",
        params={"sampling": {"max_tokens": max_tokens, "temperature": 0}},
    )


def stream_done(rid: str) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_DONE, rid, None, source="thinker")


def upstream_result(rid: str, tokens: list[int]) -> IncomingMessage:
    return IncomingMessage(IncomingKind.NEW_REQUEST, rid, {"token_ids": tokens}, params={"sampling": {"max_tokens": 8, "temperature": 0}})


UPSTREAM = [11, 12, 13, 14, 15]


def test_a_stream_started_request_waits_for_its_input_and_ignores_late_messages(runner: HFCausalLMRunner) -> None:
    assert isinstance(ConditionedRunner(runner), StreamFedRunner)

    async def all_at_once() -> Outcome:
        scheduler = AutoregressiveScheduler(ConditionedRunner(runner), start_on="stream")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(stream_chunk("r", UPSTREAM))
            scheduler.inbox.put_nowait(stream_done("r"))
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            return outcomes["r"]
        finally:
            await scheduler.stop()

    async def trickled() -> tuple[Outcome, int, dict[str, Outcome]]:
        talker = ConditionedRunner(runner)
        scheduler = AutoregressiveScheduler(talker, start_on="stream")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(stream_chunk("r", UPSTREAM[:3]))
            assert await asyncio.to_thread(talker.waiting.wait, 30)  # it consumed all 3 and must wait
            await pump(scheduler, outcomes, lambda: scheduler.outbox.empty(), timeout=5)
            before_more = sum(len(c.token_ids) for c in outcomes["r"].chunks)
            scheduler.inbox.put_nowait(stream_chunk("r", UPSTREAM[3:]))
            scheduler.inbox.put_nowait(stream_done("r"))
            scheduler.inbox.put_nowait(upstream_result("r", UPSTREAM))  # fed as the last increment
            await pump(scheduler, outcomes, lambda: outcomes["r"].done)
            # Late messages for a finished request do not start it again.
            scheduler.inbox.put_nowait(stream_chunk("r", [1, 2, 3]))
            scheduler.inbox.put_nowait(upstream_result("r", UPSTREAM))
            # An aborted request is not restarted by chunks still in flight.
            scheduler.inbox.put_nowait(stream_chunk("gone", [1, 2]))
            await pump(scheduler, outcomes, lambda: "gone" in outcomes)
            scheduler.abort("gone")
            scheduler.inbox.put_nowait(stream_chunk("gone", [3, 4]))
            # A request after all that still runs normally: the queue above is drained before it.
            scheduler.inbox.put_nowait(stream_chunk("next", UPSTREAM))
            scheduler.inbox.put_nowait(stream_done("next"))
            await pump(scheduler, outcomes, lambda: "next" in outcomes and outcomes["next"].done)
            load = scheduler.load()
            assert (load.kv_slots, load.running, load.queued) == (0, 0, 0)  # "gone" did not come back
            return outcomes["r"], before_more, outcomes
        finally:
            await scheduler.stop()

    reference = asyncio.run(all_at_once())
    outcome, before_more, outcomes = asyncio.run(trickled())
    assert outcome.result.token_ids == reference.result.token_ids
    assert outcome.result.completion_tokens == 8
    # prefill read 2 upstream tokens and gave token 1; steps 2 and 3 read the 3rd... then it waited.
    assert before_more == 2
    assert outcomes["next"].result.token_ids == reference.result.token_ids
    assert outcomes["gone"].result is None and outcomes["gone"].error is None
    assert runner.kv_slots() == 0


def test_a_refused_stream_request_fails_once(runner: HFCausalLMRunner) -> None:
    async def scenario() -> list[str]:
        scheduler = AutoregressiveScheduler(ConditionedRunner(runner), start_on="stream")
        await scheduler.start()
        errors: list[str] = []
        try:
            for tokens in ([1, 2], [3], [4]):
                bad = stream_chunk("bad", tokens)
                bad.params = {"sampling": {"top_k": -1}}
                scheduler.inbox.put_nowait(bad)
            scheduler.inbox.put_nowait(stream_chunk("ok", UPSTREAM))
            scheduler.inbox.put_nowait(stream_done("ok"))
            outcomes: dict[str, Outcome] = {}
            await pump(scheduler, outcomes, lambda: "ok" in outcomes and outcomes["ok"].done)
            errors = [error for outcome in outcomes.values() for error in outcome.errors]
            assert outcomes["ok"].result is not None
            return errors
        finally:
            await scheduler.stop()

    errors = asyncio.run(scenario())
    assert len(errors) == 1 and "sampling.top_k" in errors[0]
