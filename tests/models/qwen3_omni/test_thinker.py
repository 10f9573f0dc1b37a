"""The thinker runner: batched decode gives each request what it gets alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omnictl.models.qwen3_omni import stages
from omnictl.models.qwen3_omni.thinker import ThinkerRunner

from .conftest import request


def thinker_inputs(tiny_qwen: Path, kind: str, question: str) -> dict[str, Any]:
    path = str(tiny_qwen)
    front = stages.preprocessing(path)(request(kind, question=question))
    encoded = {"preprocessing": front, "audio_encoder": stages.audio_encoder(path)(front), "image_encoder": stages.image_encoder(path)(front)}
    return stages.mm_aggregate(path)(stages.merge_multimodal(encoded))


def greedy(runner: ThinkerRunner, prompts: dict[str, dict[str, Any]], steps: int) -> dict[str, list[int]]:
    """Prefill every prompt, then decode all of them together, greedily."""
    tokens = {rid: [int(runner.prefill(rid, inputs).logits.argmax())] for rid, inputs in prompts.items()}
    for _ in range(steps):
        ids = list(prompts)
        outputs = runner.decode(ids, [tokens[rid][-1] for rid in ids])
        for rid, output in zip(ids, outputs):
            tokens[rid].append(int(output.logits.argmax()))
    for rid in prompts:
        runner.release(rid)
    return tokens


@pytest.mark.slow  # seconds of forward passes, each request alone then batched
def test_batched_decode_matches_each_request_alone(tiny_qwen: Path) -> None:
    runner = ThinkerRunner(str(tiny_qwen), "cpu")
    prompts = {
        "text": thinker_inputs(tiny_qwen, "text", "Hello"),
        "audio": thinker_inputs(tiny_qwen, "audio", "What is the capital of France? Listen."),
        "image": thinker_inputs(tiny_qwen, "image", "Describe this image."),
    }
    lengths = {rid: p["inputs_embeds"].shape[0] for rid, p in prompts.items()}
    assert len(set(lengths.values())) == 3, lengths  # padding is exercised
    together = greedy(runner, prompts, steps=8)
    for rid, inputs in prompts.items():
        assert greedy(runner, {rid: inputs}, steps=8)[rid] == together[rid], rid
    assert runner.kv_slots() == 0


def test_talker_prefix_carries_media_hidden_states_once(tiny_qwen: Path) -> None:
    runner = ThinkerRunner(str(tiny_qwen), "cpu")
    inputs = thinker_inputs(tiny_qwen, "audio", "Listen.")
    runner.prefill("r", inputs)
    prefix = runner.take_talker_prefix("r")
    assert prefix is not None and runner.take_talker_prefix("r") is None
    audio_positions = int((prefix["prompt_ids"] == runner.mm_token_ids[0]).sum())
    assert audio_positions > 0 and prefix["mm_hidden"].shape == (audio_positions, 32)
    assert torch.equal(prefix["audio_feature_lengths"], inputs["audio_feature_lengths"])
    runner.release("r")
