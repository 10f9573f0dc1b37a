"""The talker runner: batched decode equals each request alone; streaming waits for the thinker."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnictl.models.qwen3_omni.payloads import ThinkerDelta, ThinkerResult
from omnictl.models.qwen3_omni.talker import TalkerRunner
from omnictl.models.qwen3_omni.thinker import ThinkerRunner
from omnictl.outputs import FinishReason

from .test_thinker import greedy, thinker_inputs

pytestmark = pytest.mark.slow  # the thinker and the talker generating, for tens of seconds

STEPS = 6


def thinker_answers(tiny_qwen: Path) -> dict[str, ThinkerResult]:
    """Per request: the thinker's final result plus the talker prefix, as the talker receives it."""
    thinker = ThinkerRunner(str(tiny_qwen), "cpu")
    answers = {}
    for kind, question in (("text", "Hello"), ("audio", "What is the capital of France? Listen."), ("image", "Describe.")):
        inputs = thinker_inputs(tiny_qwen, kind, question)
        tokens = greedy(thinker, {kind: inputs}, steps=9)[kind]
        thinker.prefill(kind, inputs)
        prefix = thinker.take_talker_prefix(kind)
        thinker.release(kind)
        answers[kind] = ThinkerResult(
            talker_prefix=prefix,
            token_ids=tokens,
            completion_tokens=len(tokens),
            finish_reason=FinishReason.LENGTH,
            text="",
        )
    return answers


def talk(runner: TalkerRunner, answers: dict[str, ThinkerResult]) -> dict[str, torch.Tensor]:
    last = {}
    for rid, answer in answers.items():
        runner.feed(rid, answer, done=True)
        assert runner.ready(rid)
        last[rid] = int(runner.prefill(rid, {}).logits.argmax())
    for _ in range(STEPS):
        ids = list(answers)
        for rid, output in zip(ids, runner.decode(ids, [last[rid] for rid in ids])):
            last[rid] = int(output.logits.argmax())
    frames = {}
    for rid in answers:
        runner.release(rid)
        frames[rid] = runner.take_frames(rid, final=True)
    return frames


def test_batched_talker_matches_each_request_alone(tiny_qwen: Path) -> None:
    answers = thinker_answers(tiny_qwen)
    runner = TalkerRunner(str(tiny_qwen), "cpu")
    together = talk(runner, answers)
    for rid, answer in answers.items():
        alone = talk(runner, {rid: answer})[rid]
        assert alone.shape == (STEPS, 4)
        assert torch.equal(alone, together[rid]), rid
    assert runner.kv_slots() == 0


def test_talker_waits_for_the_thinker_tokens_it_speaks(tiny_qwen: Path) -> None:
    answer = thinker_answers(tiny_qwen)["text"]
    runner = TalkerRunner(str(tiny_qwen), "cpu")
    tokens = answer.token_ids
    runner.feed("r", ThinkerDelta(talker_prefix=answer.talker_prefix, token_ids=tokens[:1], text=""), done=False)
    # The first token is spoken only if it is not the answer's last: one more is needed.
    assert not runner.ready("r")
    runner.feed("r", ThinkerDelta(token_ids=tokens[1:3], text=""), done=False)
    assert runner.ready("r")
    first = int(runner.prefill("r", {}).logits.argmax())
    runner.decode(["r"], [first])  # step 0 speaks thinker token 1; token 2 is known
    assert not runner.ready("r")  # step 1 speaks token 2, which is only spoken if token 3 exists
    runner.feed("r", answer, done=True)
    assert runner.ready("r")
    runner.forget("r")
    assert runner.kv_slots() == 0


def test_empty_answer_ends_the_talker_at_once(tiny_qwen: Path) -> None:
    answer = thinker_answers(tiny_qwen)["text"]
    runner = TalkerRunner(str(tiny_qwen), "cpu")
    # The thinker's first token was its stop token: no text tokens, one completion token.
    silent = ThinkerResult(talker_prefix=answer.talker_prefix, token_ids=[], completion_tokens=1, finish_reason=FinishReason.STOP, text="")
    runner.feed("r", silent, done=True)
    assert runner.ready("r")
    assert int(runner.prefill("r", {}).logits.argmax()) in runner.stop_token_ids()
    assert runner.kv_slots() == 0
    runner.release("r")
    assert runner.take_frames("r", final=True).shape == (0, 4)
