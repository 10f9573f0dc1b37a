"""Long prompts prefill in chunks: other requests keep decoding and aborts get in between."""

from __future__ import annotations

import time
from typing import Any

import torch

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.tiny_causal_lm import VOCAB_SIZE
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from tests.schedulers.harness import Outcome, new_request, pump, wait_for_condition
from tests.support.wait import run

LONG = [3 + (i * 7) % (VOCAB_SIZE - 8) for i in range(1900)]  # under tiny_llama's 2048 positions
CHUNK = 64


def test_a_chunked_prefill_gives_the_same_scores_and_tokens_as_a_whole_one(endless_model: Any) -> None:
    whole, chunked = HFCausalLMRunner(endless_model), HFCausalLMRunner(endless_model)
    expected = whole.prefill("a", {"input_ids": LONG[:300]})
    steps = []
    while True:
        used, output = chunked.prefill_chunk("a", {"input_ids": LONG[:300]}, 128)
        steps.append(used)
        if output is not None:
            break
    assert steps == [128, 128, 44] and output.prompt_tokens == 300
    torch.testing.assert_close(output.logits, expected.logits, rtol=1e-4, atol=1e-4)
    token = int(expected.logits.argmax())
    for _ in range(8):  # the carried cache decodes like the whole one
        a, b = whole.decode(["a"], [token])[0], chunked.decode(["a"], [token])[0]
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
        token = int(a.logits.argmax())


def test_another_requests_tokens_keep_coming_while_a_long_prompt_prefills(endless_model: Any) -> None:
    runner = HFCausalLMRunner(endless_model)
    order: list[str] = []  # which request each output belonged to, in arrival order

    async def scenario() -> dict[str, Outcome]:
        scheduler = AutoregressiveScheduler(runner, prefill_chunk=CHUNK)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        original = scheduler.outbox.get

        async def get() -> Any:
            message = await original()
            order.append(message.request_id)
            return message

        scheduler.outbox.get = get  # type: ignore[method-assign]  # records the order only
        try:
            scheduler.inbox.put_nowait(new_request("chat", {"input_ids": [5, 6, 7]}, max_tokens=400, temperature=0))
            await pump(scheduler, outcomes, lambda: "chat" in outcomes and len(outcomes["chat"].chunks) >= 2)
            order.append("long arrives")
            scheduler.inbox.put_nowait(new_request("long", {"input_ids": LONG}, max_tokens=2, temperature=0))
            await pump(scheduler, outcomes, lambda: all(k in outcomes and outcomes[k].done for k in ("chat", "long")))
        finally:
            await scheduler.stop()
        return outcomes

    outcomes = run(scenario(), timeout=120)
    assert outcomes["long"].result.prompt_tokens == len(LONG) and outcomes["chat"].result.completion_tokens == 400
    arrived, first_long = order.index("long arrives"), order.index("long")
    between = order[arrived:first_long].count("chat")
    # ~30 chunks of 64 tokens, a decode step of "chat" after each; prefilled whole, none.
    assert between >= 15, (between, len(LONG) // CHUNK)


def test_an_abort_stops_a_long_prefill_part_way_and_frees_its_cache(endless_model: Any) -> None:
    runner = HFCausalLMRunner(endless_model)

    async def scenario() -> tuple[dict[str, Outcome], float]:
        scheduler = AutoregressiveScheduler(runner, prefill_chunk=CHUNK)
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(new_request("long", {"input_ids": LONG}, max_tokens=2, temperature=0))
            await wait_for_condition(lambda: "long" in runner._prefills)  # part-way through its prompt
            started = time.monotonic()
            scheduler.abort("long")
            await wait_for_condition(lambda: runner.kv_slots() == 0 and scheduler.load().running == 0)
            took = time.monotonic() - started
            scheduler.inbox.put_nowait(new_request("next", {"input_ids": [5, 6]}, max_tokens=3, temperature=0))
            await pump(scheduler, outcomes, lambda: "next" in outcomes and outcomes["next"].done)
        finally:
            await scheduler.stop()
        return outcomes, took

    outcomes, took = run(scenario(), timeout=120)
    assert "long" not in outcomes  # no token, no result, no error: it just left
    assert outcomes["next"].result.completion_tokens == 3
    assert took < 2.0, took
