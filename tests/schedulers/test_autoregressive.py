"""The autoregressive scheduler, driven through its inbox/outbox with a real tiny transformers model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from tests.schedulers.harness import GatedRunner, Outcome, RecordingProfiler, new_request, pump, wait_for_condition
from omnictl.exceptions import InvalidRequest
from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.profiling.events import EventKind
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput

PROMPTS = {"short": "hi", "medium": "the quick brown fox", "long": "a much longer prompt that has many more tokens in it"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


async def generate(scheduler: AutoregressiveScheduler, requests: dict[str, tuple[Any, dict[str, Any]]]) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for rid, (data, sampling) in requests.items():
        scheduler.inbox.put_nowait(new_request(rid, data, **sampling))
    await pump(scheduler, outcomes, lambda: all(rid in outcomes and outcomes[rid].done for rid in requests))
    return outcomes


async def solo(runner: Any, prompt: str, **sampling: Any) -> Outcome:
    scheduler = AutoregressiveScheduler(runner)
    await scheduler.start()
    try:
        return (await generate(scheduler, {"solo": ({"prompt": prompt}, sampling)}))["solo"]
    finally:
        await scheduler.stop()


def test_greedy_tokens_equal_transformers_generate(endless_model: Any, tokenizer: Any) -> None:
    runner = HFCausalLMRunner(endless_model, tokenizer)
    outcome = run(solo(runner, PROMPTS["medium"], max_tokens=16, temperature=0))
    ids = tokenizer(PROMPTS["medium"], return_tensors="pt")["input_ids"]
    expected = endless_model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :].tolist()
    assert outcome.result.token_ids == expected
    assert outcome.result.text == tokenizer.decode(expected)
    assert outcome.result.prompt_tokens == ids.shape[1]
    assert outcome.result.completion_tokens == 16
    assert outcome.result.finish_reason == "length"


def test_requests_join_mid_flight_and_output_does_not_depend_on_the_batch(runner: HFCausalLMRunner) -> None:
    # Batched float32 matmuls may differ from single-row ones in the last bits, so the
    # invariance checked here is the greedy tokens (plus the logits to a tight tolerance
    # in tests/models/test_hf_causal_lm.py), not bitwise hidden states.
    sampling = {"max_tokens": 24, "temperature": 0}
    alone = {name: run(solo(runner, prompt, **sampling)).result.token_ids for name, prompt in PROMPTS.items()}

    gated = GatedRunner(runner)
    gated.hold(3)  # "medium" joins after the long request's 4th token
    gated.hold(8)  # "short" joins later still

    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(gated)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("long", {"prompt": PROMPTS["long"]}, **sampling))
            for gate, joiner in ((3, "medium"), (8, "short")):
                assert await asyncio.to_thread(gated.arrived[gate].wait, 30)
                scheduler.inbox.put_nowait(new_request(joiner, {"prompt": PROMPTS[joiner]}, **sampling))
                await wait_for_condition(lambda: scheduler.load().queued == 1)
                gated.gates[gate].set()
            await pump(scheduler, outcomes, lambda: all(k in outcomes and outcomes[k].done for k in PROMPTS))
        finally:
            await scheduler.stop()
        return outcomes

    outcomes = run(scenario())
    for name in PROMPTS:
        assert outcomes[name].result.token_ids == alone[name], name
    assert gated.batches[0] == ("long",)
    assert ("long", "medium") in gated.batches
    assert ("long", "medium", "short") in gated.batches
    assert gated.batches[-1] == ("short",)  # the others finished and left the batch
    assert runner.kv_slots() == 0


def test_stream_chunks_add_up_to_the_result_every_n_steps(runner: HFCausalLMRunner) -> None:
    async def scenario() -> Outcome:
        scheduler = AutoregressiveScheduler(runner, stream_every=4, emit_hidden=True)
        await scheduler.start()
        try:
            return (await generate(scheduler, {"r": ({"prompt": "hello"}, {"max_tokens": 10, "temperature": 0})}))["r"]
        finally:
            await scheduler.stop()

    outcome = run(scenario())
    assert [len(chunk.token_ids) for chunk in outcome.chunks] == [4, 4, 2]
    assert sum((chunk.token_ids for chunk in outcome.chunks), []) == outcome.result.token_ids
    assert "".join(chunk.text for chunk in outcome.chunks) == outcome.result.text
    hidden = outcome.result.hidden
    assert hidden.shape == (10, 32)
    assert torch.equal(torch.cat([chunk.hidden for chunk in outcome.chunks]), hidden)


def test_stop_string_cuts_text_and_is_never_streamed(runner: HFCausalLMRunner) -> None:
    free = run(solo(runner, "hello", max_tokens=30, temperature=0)).result
    text = free.text
    stop = text[12:14]
    cut = text.find(stop)
    assert cut >= 0
    stopped = run(solo(runner, "hello", max_tokens=30, temperature=0, stop=[stop, "never-there"]))
    assert stopped.result.finish_reason == "stop"
    assert stopped.result.text == text[:cut]
    streamed = "".join(chunk.text for chunk in stopped.chunks)
    assert streamed == text[:cut]
    # Generation ended at the token that completed the stop string.
    assert stopped.result.completion_tokens == cut + len(stop)


def test_stop_token_ends_the_request_and_is_not_returned(endless_model: Any, tokenizer: Any) -> None:
    free = run(solo(HFCausalLMRunner(endless_model, tokenizer), "abc", max_tokens=12, temperature=0)).result
    stop_token = free.token_ids[4]
    cut = free.token_ids.index(stop_token)
    stopping = HFCausalLMRunner(endless_model, tokenizer, extra_stop_token_ids=[stop_token])
    outcome = run(solo(stopping, "abc", max_tokens=12, temperature=0))
    assert outcome.result.token_ids == free.token_ids[:cut]
    assert outcome.result.text == tokenizer.decode(free.token_ids[:cut])
    assert outcome.result.completion_tokens == cut + 1
    assert outcome.result.finish_reason == "stop"
    assert sum((chunk.token_ids for chunk in outcome.chunks), []) == free.token_ids[:cut]
    assert stopping.kv_slots() == 0


def test_seeded_sampling_is_deterministic_whatever_shares_the_batch(runner: HFCausalLMRunner) -> None:
    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(runner)
        await scheduler.start()
        try:
            sampled = {"max_tokens": 20, "temperature": 1.0, "top_k": 50, "top_p": 0.95}
            return await generate(
                scheduler,
                {
                    "a": ({"prompt": "hello"}, {**sampled, "seed": 7}),
                    "b": ({"prompt": "hello"}, {**sampled, "seed": 7}),
                    "c": ({"prompt": "hello"}, {**sampled, "seed": 8}),
                    "greedy": ({"prompt": "hello"}, {"max_tokens": 20, "temperature": 0}),
                },
            )
        finally:
            await scheduler.stop()

    outcomes = run(scenario())
    alone = run(solo(runner, "hello", max_tokens=20, temperature=1.0, top_k=50, top_p=0.95, seed=7)).result
    assert outcomes["a"].result.token_ids == outcomes["b"].result.token_ids == alone.token_ids
    assert outcomes["c"].result.token_ids != outcomes["a"].result.token_ids
    greedy = run(solo(runner, "hello", max_tokens=20, temperature=0)).result
    assert outcomes["greedy"].result.token_ids == greedy.token_ids


def test_abort_frees_the_kv_cache_and_queued_requests(runner: HFCausalLMRunner) -> None:
    async def scenario() -> tuple[dict[str, Outcome], list[int]]:
        scheduler = AutoregressiveScheduler(runner, max_batch=1)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("endless", {"prompt": "go"}, max_tokens=100_000, temperature=0))
            scheduler.inbox.put_nowait(new_request("queued", {"prompt": "wait"}, max_tokens=5, temperature=0))
            await pump(scheduler, outcomes, lambda: "endless" in outcomes and len(outcomes["endless"].chunks) >= 3)
            load = scheduler.load()
            seen = [load.kv_slots, load.running, load.queued]
            scheduler.abort("queued")  # max_batch=1 keeps it waiting behind "endless"
            await wait_for_condition(lambda: scheduler.load().queued == 0)
            scheduler.abort("endless")
            await wait_for_condition(lambda: scheduler.load().kv_slots == 0 and scheduler.load().running == 0)
            # The scheduler still serves new work, and nothing more arrives for the aborted ones.
            scheduler.inbox.put_nowait(new_request("after", {"prompt": "next"}, max_tokens=5, temperature=0))
            await pump(scheduler, outcomes, lambda: "after" in outcomes and outcomes["after"].done)
            return outcomes, seen
        finally:
            await scheduler.stop()

    outcomes, seen = run(scenario())
    assert seen == [1, 1, 1]
    assert outcomes["endless"].result is None and outcomes["endless"].error is None
    assert "queued" not in outcomes
    assert outcomes["after"].result.completion_tokens == 5
    assert runner.kv_slots() == 0


def test_invalid_sampling_fails_the_request_naming_the_field(runner: HFCausalLMRunner) -> None:
    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(runner)
        scheduler.stage_name = "thinker"
        await scheduler.start()
        try:
            return await generate(
                scheduler,
                {"bad": ({"prompt": "x"}, {"top_p": 2.0}), "typo": ({"prompt": "x"}, {"max_token": 3}),
                 "noinput": ({"text": "x"}, {"max_tokens": 3})},
            )
        finally:
            await scheduler.stop()

    outcomes = run(scenario())
    assert "sampling.top_p" in outcomes["bad"].error and "thinker" in outcomes["bad"].error
    assert "max_token" in outcomes["typo"].error
    assert "prefill failed" in outcomes["noinput"].error and "input_ids" in outcomes["noinput"].error
    assert runner.kv_slots() == 0


def test_the_hf_runner_refuses_the_sampling_fields_it_cannot_honour_naming_each(runner: HFCausalLMRunner) -> None:
    """Issue 40 bug 7: penalties, min_p, logit_bias and logprobs were accepted and ignored.
    The HF runner's sampler has none of them: each is refused by name; a value that changes
    nothing (a penalty of 0, logprobs false) is honoured, and the request runs."""
    asked = {"frequency_penalty": 0.5, "presence_penalty": -1.0, "repetition_penalty": 1.2, "min_p": 0.1,
             "logit_bias": {"5": 10}, "logprobs": True}

    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(runner)
        scheduler.stage_name = "thinker"
        await scheduler.start()
        try:
            requests: dict[str, tuple[Any, dict[str, Any]]] = {
                name: ({"prompt": "x"}, {name: value, "max_tokens": 2}) for name, value in asked.items()}
            requests["neutral"] = ({"prompt": "x"}, {"frequency_penalty": 0, "repetition_penalty": 1.0,
                                                     "logprobs": False, "max_tokens": 2})
            return await generate(scheduler, requests)
        finally:
            await scheduler.stop()

    outcomes = run(scenario())
    for name in asked:
        assert outcomes[name].error is not None and f"sampling.{name}: the HF runner" in outcomes[name].error
        assert "cannot honour" in outcomes[name].error and "stage thinker" in outcomes[name].error
    assert outcomes["neutral"].result is not None and outcomes["neutral"].result.completion_tokens == 2
    with pytest.raises(InvalidRequest, match="default_sampling.min_p: the HF runner"):
        AutoregressiveScheduler(runner, default_sampling={"min_p": 0.2})
    assert runner.kv_slots() == 0


def test_profiling_events_cover_prefill_first_emit_and_decode_steps(runner: HFCausalLMRunner) -> None:
    profiler = RecordingProfiler()

    async def scenario() -> None:
        scheduler = AutoregressiveScheduler(runner)
        scheduler.profiler = profiler
        await scheduler.start()
        try:
            await generate(scheduler, {"p": ({"prompt": "abc"}, {"max_tokens": 6, "temperature": 0})})
        finally:
            await scheduler.stop()

    run(scenario())
    kinds = [kind for kind, rid, _ in profiler.events if rid == "p"]
    assert kinds == [EventKind.PREFILL_START, EventKind.PREFILL_END, EventKind.FIRST_EMIT, EventKind.DECODE_STEPS]
    steps = [meta for kind, _, meta in profiler.events if kind is EventKind.DECODE_STEPS][0]
    assert steps["steps"] == 5  # the first token comes from the prefill
    assert isinstance(steps["seconds"], float) and steps["seconds"] > 0


class NanFor(GatedRunner):
    """Test double: the real runner, but one request's scores turn to NaN at its 3rd step."""

    def __init__(self, inner: HFCausalLMRunner, victim: str) -> None:
        super().__init__(inner)
        self.victim = victim
        self.steps = 0

    def decode(self, request_ids: Any, token_ids: Any) -> Any:
        outputs = super().decode(request_ids, token_ids)
        if self.victim in request_ids:
            self.steps += 1
            if self.steps == 3:
                row = list(request_ids).index(self.victim)
                outputs[row] = StepOutput(logits=torch.full_like(outputs[row].logits, float("nan")))
        return outputs


def test_a_request_whose_sampling_fails_leaves_and_the_rest_carry_on(runner: HFCausalLMRunner) -> None:
    sampled = {"max_tokens": 8, "temperature": 1.0, "seed": 1}

    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(NanFor(runner, "victim"))
        scheduler.stage_name = "thinker"
        await scheduler.start()
        try:
            return await generate(scheduler, {"victim": ({"prompt": "x"}, sampled), "other": ({"prompt": "y"}, sampled)})
        finally:
            await scheduler.stop()

    outcomes = run(scenario())
    assert "thinker" in outcomes["victim"].error and "sampling" in outcomes["victim"].error
    assert outcomes["other"].result.completion_tokens == 8
    assert outcomes["other"].result.token_ids == run(solo(runner, "y", **sampled)).result.token_ids
    assert runner.kv_slots() == 0


class BrokenReady(GatedRunner):
    """Test double whose stream-input readiness check raises: a bug outside any request's compute."""

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        return None

    def ready(self, request_id: str) -> bool:
        raise RuntimeError("ready() is broken")


# The worker re-raises so the traceback reaches the stage's stderr; pytest reports that as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_crashed_worker_fails_held_and_new_requests_instead_of_hanging(runner: HFCausalLMRunner) -> None:
    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(BrokenReady(runner))
        await scheduler.start()
        try:
            first = await generate(scheduler, {"held": ({"prompt": "x"}, {"max_tokens": 3})})
            later = await generate(scheduler, {"later": ({"prompt": "x"}, {"max_tokens": 3})})
            return {**first, **later}
        finally:
            await scheduler.stop()

    outcomes = run(scenario())
    assert "worker crashed" in outcomes["held"].error and "ready() is broken" in outcomes["held"].error
    assert "worker crashed" in outcomes["later"].error


def test_a_resumed_request_takes_the_tokens_its_caller_has_and_streams_only_what_follows(
    runner: HFCausalLMRunner,
) -> None:
    from omnictl.messages import RESUME_PARAM
    from omnictl.schedulers.base import IncomingKind, IncomingMessage

    sampling = {"max_tokens": 16, "temperature": 0}
    clean = run(solo(runner, PROMPTS["medium"], **sampling))
    seen = [t for chunk in clean.chunks for t in chunk.token_ids][:6]  # what a caller had when its replica died

    async def resumed() -> Outcome:
        scheduler = AutoregressiveScheduler(runner)
        scheduler.stage_name = "think"
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            params = {"sampling": sampling, RESUME_PARAM: {"think": seen, "other": [1, 2]}}
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", {"prompt": PROMPTS["medium"]},
                                                       params=params))
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
        finally:
            await scheduler.stop()
        return outcomes["r"]

    again = run(resumed())
    assert again.result.token_ids == clean.result.token_ids and again.result.text == clean.result.text
    assert again.result.completion_tokens == clean.result.completion_tokens  # the forced ones count
    assert [t for chunk in again.chunks for t in chunk.token_ids] == clean.result.token_ids[6:]
    # the caller's text, joined: what it had, then the continuation, no word twice or missing
    had = "".join(c.text for c in clean.chunks)[: len(runner.detokenize(seen))]
    assert had + "".join(c.text for c in again.chunks) == clean.result.text


class ChunkLog(GatedRunner):
    """Records every prefill part (request, positions done) and every decode batch, in order."""

    def __init__(self, inner: HFCausalLMRunner) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, Any]] = []

    def prefill_chunk(self, request_id: str, inputs: Any, max_tokens: int) -> tuple[int, StepOutput | None]:
        used, output = self.inner.prefill_chunk(request_id, inputs, max_tokens)
        self.log.append(("prefill", (request_id, used, output is not None)))
        return used, output

    def decode(self, request_ids: Any, token_ids: Any) -> list[StepOutput]:
        self.log.append(("decode", tuple(request_ids)))
        return super().decode(request_ids, token_ids)


def test_a_request_part_way_through_its_prompt_counts_against_the_batch_limit(endless_model: Any) -> None:
    """max_batch=2: one request decoding, one long prompt prefilling in chunks; a third that
    arrives meanwhile waits (no prefill, no decode step) until one of them leaves, and a
    round never prefills more than prefill_chunk positions over all requests."""
    chunk, long_prompt = 32, [3 + (i * 7) % 50 for i in range(150)]  # 5 rounds of prefill
    runner = ChunkLog(HFCausalLMRunner(endless_model))

    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(runner, max_batch=2, prefill_chunk=chunk)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("chat", {"input_ids": [5, 6, 7]}, max_tokens=30, temperature=0))
            await pump(scheduler, outcomes, lambda: "chat" in outcomes and len(outcomes["chat"].chunks) >= 2)
            scheduler.inbox.put_nowait(new_request("long", {"input_ids": long_prompt}, max_tokens=2, temperature=0))
            await wait_for_condition(lambda: ("prefill", ("long", chunk, False)) in runner.log)  # part-way in
            scheduler.inbox.put_nowait(new_request("third", {"input_ids": [8, 9]}, max_tokens=2, temperature=0))
            await pump(scheduler, outcomes, lambda: all(k in outcomes and outcomes[k].done for k in ("chat", "long", "third")))
        finally:
            await scheduler.stop()
        return outcomes

    outcomes = run(scenario())
    assert outcomes["long"].result.prompt_tokens == len(long_prompt) and outcomes["third"].result.completion_tokens == 2
    log = runner.log
    long_in = next(i for i, (kind, what) in enumerate(log) if kind == "prefill" and what[0] == "long" and what[2])
    long_out = max(i for i, (kind, what) in enumerate(log) if kind == "decode" and "long" in what)
    third_starts = next(i for i, (kind, what) in enumerate(log) if kind == "prefill" and what[0] == "third")
    # While "long" was prefilling and then decoding, the batch was full: "third" waited for it to leave.
    assert third_starts > long_out > long_in, (third_starts, long_out, long_in)
    assert all(len(what) <= 2 for kind, what in log if kind == "decode")
    # "chat" kept decoding between long's parts, each round within the budget.
    parts = [i for i, (kind, what) in enumerate(log) if kind == "prefill" and what[0] == "long"]
    assert len(parts) == -(-len(long_prompt) // chunk)
    assert all(any(log[j] == ("decode", ("chat",)) for j in range(a, b)) for a, b in zip(parts, parts[1:]))
    rounds: list[int] = [0]
    for kind, what in log:
        if kind == "decode":
            rounds.append(0)
        else:
            rounds[-1] += what[1]
    assert max(rounds) <= chunk, rounds


class _OneToken:
    """Answers every prompt with one token, then the stop token (no model needed)."""

    def prefill(self, request_id: str, inputs: Any) -> StepOutput:
        return StepOutput(logits=torch.tensor([0.0, float("-inf")]), prompt_tokens=1)

    def decode(self, request_ids: Any, token_ids: Any) -> list[StepOutput]:
        return [StepOutput(logits=torch.tensor([float("-inf"), 0.0])) for _ in request_ids]

    def release(self, request_id: str) -> None:
        pass

    def stop_token_ids(self) -> set[int]:
        return {1}

    def detokenize(self, token_ids: Any) -> str:
        return "x" * len(token_ids)

    def kv_slots(self) -> int:
        return 0


def test_an_idle_worker_keeps_no_input_of_a_finished_request_alive() -> None:
    # An input's tensor may be a view of another process's shared-memory slot, lent until it is
    # freed: the worker's last round must not hold it in a local while it waits for the next.
    import gc
    import weakref

    import numpy as np

    async def body() -> bool:
        scheduler = AutoregressiveScheduler(_OneToken())
        await scheduler.start()
        try:
            features = np.zeros(16, dtype=np.float32)
            held = weakref.ref(features)
            outcomes: dict[str, Outcome] = {}
            scheduler.inbox.put_nowait(new_request("r", {"features": features}))
            del features
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            assert outcomes["r"].result.text == "x"
            await asyncio.sleep(0.1)  # the worker is back waiting
            gc.collect()
            return held() is None
        finally:
            await scheduler.stop()

    assert run(body())
