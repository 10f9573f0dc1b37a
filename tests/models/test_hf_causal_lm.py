"""HFCausalLMRunner: per-request KV caches, batched decode with padding, prompt forms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from omnictl.exceptions import InvalidRequest
from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.tiny_causal_lm import tiny_llama, tiny_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama(seed=5, eos=False)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def greedy_alone(model: Any, prompt_ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    runner = HFCausalLMRunner(model)
    out = runner.prefill("x", {"input_ids": prompt_ids})
    tokens, logits = [int(out.logits.argmax())], [out.logits]
    for _ in range(steps - 1):
        out = runner.decode(["x"], [tokens[-1]])[0]
        tokens.append(int(out.logits.argmax()))
        logits.append(out.logits)
    return tokens, logits


def test_batched_decode_matches_each_request_alone(model: Any) -> None:
    prompts = {"a": [5, 6, 7], "b": list(range(1, 20)), "c": [42]}
    alone = {rid: greedy_alone(model, ids, 12) for rid, ids in prompts.items()}
    runner = HFCausalLMRunner(model)
    tokens: dict[str, list[int]] = {}
    logits: dict[str, list[torch.Tensor]] = {}
    joins = {0: "a", 3: "b", 5: "c"}  # decode step at which each request is prefilled and joins
    for step in range(30):
        if step in joins:
            rid = joins[step]
            out = runner.prefill(rid, {"input_ids": prompts[rid]})
            tokens[rid], logits[rid] = [int(out.logits.argmax())], [out.logits]
        batch = [rid for rid in tokens if len(tokens[rid]) < 12]
        for rid in [rid for rid in tokens if len(tokens[rid]) == 12]:
            runner.release(rid)
        if not batch:
            break
        for rid, out in zip(batch, runner.decode(batch, [tokens[rid][-1] for rid in batch])):
            tokens[rid].append(int(out.logits.argmax()))
            logits[rid].append(out.logits)
    for rid in prompts:
        assert tokens[rid] == alone[rid][0], rid
        # Padding and masks only add exact zeros; what remains is matmul blocking noise.
        for mine, reference in zip(logits[rid], alone[rid][1]):
            torch.testing.assert_close(mine, reference, rtol=0, atol=1e-5)
    for rid in prompts:
        runner.release(rid)
    assert runner.kv_slots() == 0


def test_greedy_equals_generate_and_hidden_is_the_last_layer(model: Any) -> None:
    ids = [10, 20, 30, 40]
    tokens, _ = greedy_alone(model, ids, 8)
    expected = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, 4:].tolist()
    assert tokens == expected
    runner = HFCausalLMRunner(model, hidden_layer=-1)
    out = runner.prefill("h", {"input_ids": ids})
    reference = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
    torch.testing.assert_close(out.hidden, reference)
    assert out.prompt_tokens == 4


def test_prompt_forms_agree(model: Any, tokenizer: Any) -> None:
    runner = HFCausalLMRunner(model, tokenizer)
    text = "<user>hello\n<assistant>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    embeds = model.get_input_embeddings()(torch.tensor(ids)).detach()
    forms = {
        "ids": {"input_ids": ids},
        "tensor": {"input_ids": torch.tensor(ids)},
        "prompt": {"prompt": text},
        "messages": {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]},
        "embeds": {"inputs_embeds": embeds},
    }
    outputs = {name: runner.prefill(name, inputs) for name, inputs in forms.items()}
    for name, out in outputs.items():
        assert out.prompt_tokens == len(ids), name
        torch.testing.assert_close(out.logits, outputs["ids"].logits, rtol=0, atol=1e-5)
    assert runner.kv_slots() == len(forms)
    assert runner.detokenize(tokenizer("Paris")["input_ids"]) == "Paris"


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ({}, "input_ids"),
        ({"prompt": "a", "input_ids": [1]}, "exactly one"),
        ({"prompt": ""}, "prompt is empty"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
    ],
)
def test_bad_inputs_are_named(model: Any, tokenizer: Any, inputs: dict[str, Any], named: str) -> None:
    runner = HFCausalLMRunner(model, tokenizer)
    with pytest.raises(InvalidRequest, match=named.replace("[", r"\[").replace("]", r"\]")):
        runner.prefill("r", inputs)
    assert runner.kv_slots() == 0


def test_release_is_idempotent_and_unknown_requests_are_named(model: Any) -> None:
    runner = HFCausalLMRunner(model)
    runner.prefill("a", {"input_ids": [1, 2]})
    runner.prefill("b", {"input_ids": [3]})
    runner.decode(["a", "b"], [4, 5])
    runner.release("a")
    runner.release("a")
    assert runner.kv_slots() == 1
    with pytest.raises(KeyError, match="'a'"):
        runner.decode(["a", "b"], [1, 1])
    runner.decode(["b"], [6])  # the survivor carries on alone
    runner.release("b")
    assert runner.kv_slots() == 0 and runner._batch is None


def test_stop_ids_come_from_the_model_and_the_tokenizer(tokenizer: Any) -> None:
    runner = HFCausalLMRunner(tiny_llama(seed=1, eos=True), tokenizer, extra_stop_token_ids=[7])
    assert runner.stop_token_ids() == {tokenizer.eos_token_id, 7}


def test_sliding_window_models_are_refused_with_the_reason() -> None:
    config = MistralConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    )
    with pytest.raises(ValueError, match="full-attention"):
        HFCausalLMRunner(MistralForCausalLM(config))


def test_from_pretrained_loads_a_local_checkpoint(tmp_path: Path, model: Any, tokenizer: Any) -> None:
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    runner = HFCausalLMRunner.from_pretrained(tmp_path)
    out = runner.prefill("r", {"prompt": "abc"})
    reference = model(tokenizer("abc", return_tensors="pt")["input_ids"]).logits[0, -1]
    torch.testing.assert_close(out.logits, reference, rtol=0, atol=1e-5)


def test_causal_lm_factory_serves_a_local_checkpoint(tmp_path: Path, model: Any, tokenizer: Any) -> None:
    import asyncio

    from omnictl.models.hf_causal_lm import causal_lm
    from omnictl.outputs import TokenResult
    from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind

    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    scheduler = causal_lm(tmp_path, hidden_layer=-1, default_sampling={"temperature": 0, "max_tokens": 4})

    async def one() -> Any:
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", {"prompt": "abc"}))
            while True:
                message = await asyncio.wait_for(scheduler.outbox.get(), timeout=30)
                if message.kind is not OutgoingKind.STREAM:
                    return message
        finally:
            await scheduler.stop()

    message = asyncio.run(one())
    assert message.kind is OutgoingKind.RESULT, message.error
    ids = tokenizer("abc", return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)[0, 3:].tolist()
    assert isinstance(message.data, TokenResult)
    assert message.data.token_ids == expected
    assert message.data.hidden.shape == (4, 32)


def test_a_request_sitting_out_a_step_keeps_its_cache(model: Any) -> None:
    # A stream-fed request (a talker waiting for input) may miss decode steps and rejoin later.
    alone_a, _ = greedy_alone(model, [1, 2, 3], 6)
    alone_b, _ = greedy_alone(model, [9, 8, 7, 6, 5], 6)
    runner = HFCausalLMRunner(model)
    a = [int(runner.prefill("a", {"input_ids": [1, 2, 3]}).logits.argmax())]
    b = [int(runner.prefill("b", {"input_ids": [9, 8, 7, 6, 5]}).logits.argmax())]
    schedule = [("a", "b"), ("a",), ("a",), ("a", "b"), ("b",), ("a", "b"), ("b",)]
    tokens = {"a": a, "b": b}
    for batch in schedule:
        batch = tuple(rid for rid in batch if len(tokens[rid]) < 6)
        for rid, out in zip(batch, runner.decode(list(batch), [tokens[rid][-1] for rid in batch])):
            tokens[rid].append(int(out.logits.argmax()))
    assert tokens["a"] == alone_a and tokens["b"] == alone_b


def test_a_prompt_past_the_context_length_is_refused_before_the_forward_pass(model: Any, tokenizer: Any) -> None:
    runner = HFCausalLMRunner(model, tokenizer)
    limit = runner.context_length
    assert isinstance(limit, int) and limit > 2
    with pytest.raises(InvalidRequest, match=f"context length is {limit}") as caught:
        runner.prefill("long", {"input_ids": [1] * limit})
    assert caught.value.field == "input_ids"
    with pytest.raises(InvalidRequest, match=f"context length is {limit}"):
        runner.prefill("long", {"inputs_embeds": torch.zeros(limit + 5, model.config.hidden_size)})
    assert runner.kv_slots() == 0
    assert runner.prefill("fits", {"input_ids": [1] * (limit - 1)}).prompt_tokens == limit - 1
