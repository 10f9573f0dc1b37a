"""One autoregressive request's state, step by step, against a letters runner (a test double
for the model: token i is the letter chr(97 + i), and each step's logits pick a chosen
token greedily): stopping on a stop token, a stop string or the length, the chunks it
streams, teacher-forced tokens of a lost attempt, and its hidden rows."""

from __future__ import annotations

from typing import Sequence

import torch

from omnictl.outputs import FinishReason, TokenResult
from omnictl.schedulers.ar_request import ArRequest
from omnictl.schedulers.runner import StepOutput
from omnictl.schedulers.sampling import SamplingParams

VOCAB = 26
STOP = 25  # "z" is the stop token


class Letters:
    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(97 + t) for t in token_ids)


def step(token: int, hidden: float | None = None) -> StepOutput:
    logits = torch.full((VOCAB,), -10.0)
    logits[token] = 10.0
    return StepOutput(logits, None if hidden is None else torch.full((1, 3), hidden))


def greedy(**kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kwargs)  # type: ignore[arg-type]


def test_a_stop_token_ends_the_request_uncounted_in_its_text_but_counted_as_a_completion_token() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=10)), Letters()
    for token in (0, 1, STOP):
        assert request.finish_reason is None
        request.take(step(token), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is FinishReason.STOP
    assert request.token_ids == [0, 1] and request.completion_tokens == 3 and request.last_token == STOP
    assert request.text(runner) == "ab"  # type: ignore[arg-type]


def test_the_length_limit_ends_it_at_exactly_max_tokens() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=2)), Letters()
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is None
    request.take(step(1), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is FinishReason.LENGTH and request.steps_since_emit == 2


def test_a_stop_string_cuts_the_text_and_what_streamed_never_held_any_of_it() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=10, stop=("cd",))), Letters()
    streamed = []
    for token in (0, 1, 2):  # "abc": "c" may begin the stop string: held back
        request.take(step(token), runner, {STOP})  # type: ignore[arg-type]
        chunk = request.chunk(runner, emit_hidden=False)  # type: ignore[arg-type]
        streamed.append(None if chunk is None else (chunk.text, chunk.token_ids))
    assert streamed == [("a", [0]), ("b", [1]), ("", [2])]
    request.take(step(3), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is FinishReason.STOP and request.final_text == "ab"
    last = request.chunk(runner, emit_hidden=False)  # type: ignore[arg-type]
    assert last is not None and (last.text, last.token_ids) == ("", [3])  # no text beyond the cut
    assert request.chunk(runner, emit_hidden=False) is None  # type: ignore[arg-type]  # nothing new
    result = request.result(runner, emit_hidden=False)  # type: ignore[arg-type]
    assert result == TokenResult(text="ab", finish_reason=FinishReason.STOP, prompt_tokens=0, completion_tokens=4,
                                 token_ids=[0, 1, 2, 3], hidden=None)


def test_hidden_rows_follow_the_kept_tokens_and_each_chunk_carries_only_its_own() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=10)), Letters()
    request.prompt_tokens = 4
    request.take(step(0, hidden=1.0), runner, {STOP})  # type: ignore[arg-type]
    request.take(step(1, hidden=2.0), runner, {STOP})  # type: ignore[arg-type]
    first = request.chunk(runner, emit_hidden=True)  # type: ignore[arg-type]
    assert first is not None and first.hidden.tolist() == [[1.0] * 3, [2.0] * 3]
    request.take(step(2, hidden=3.0), runner, {STOP})  # type: ignore[arg-type]
    request.take(step(STOP, hidden=9.0), runner, {STOP})  # type: ignore[arg-type]  # the stop token's row is not kept
    second = request.chunk(runner, emit_hidden=True)  # type: ignore[arg-type]
    assert second is not None and second.text == "c" and second.hidden.tolist() == [[3.0] * 3]
    result = request.result(runner, emit_hidden=True)  # type: ignore[arg-type]
    assert result.hidden.shape == (3, 3) and result.prompt_tokens == 4 and result.completion_tokens == 4
    assert request.result(runner, emit_hidden=False).hidden is None  # type: ignore[arg-type]


def test_without_hidden_rows_the_hidden_output_is_empty_but_sized() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=10)), Letters()
    request.take(step(STOP, hidden=1.0), runner, {STOP})  # type: ignore[arg-type]  # only the stop token
    assert request.result(runner, emit_hidden=True).hidden.shape == (0, 3)  # type: ignore[arg-type]
    bare = ArRequest("b", {}, greedy())
    assert bare.result(runner, emit_hidden=True).hidden.shape == (0, 0)  # type: ignore[arg-type]
    assert bare.result(runner, emit_hidden=False).finish_reason is FinishReason.STOP  # type: ignore[arg-type]


def test_forced_tokens_are_taken_in_order_counted_as_sent_and_never_streamed_again() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=4), forced=[7, 8]), Letters()
    request.take(step(0, hidden=1.0), runner, {STOP})  # type: ignore[arg-type]  # the model's choice is ignored
    assert request.token_ids == [7] and request.last_token == 7 and request.forced == [8]
    assert request.hidden_size == 3 and len(request.hidden_rows) == 1
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]
    assert (request.sent_tokens, request.sent_text, request.steps_since_emit) == (2, "hi", 0)
    assert request.chunk(runner, emit_hidden=False) is None  # type: ignore[arg-type]  # the caller has them
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]  # sampled again from here
    chunk = request.chunk(runner, emit_hidden=False)  # type: ignore[arg-type]
    assert chunk is not None and (chunk.text, chunk.token_ids) == ("a", [0])
    assert request.completion_tokens == 3 and request.finish_reason is None
    assert request.result(runner, emit_hidden=True).hidden.tolist() == [[1.0] * 3]  # type: ignore[arg-type]


def test_the_length_limit_also_ends_a_request_on_its_forced_tokens() -> None:
    request, runner = ArRequest("r", {}, greedy(max_tokens=2), forced=[7, 8, 9]), Letters()
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is None
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]
    assert request.finish_reason is FinishReason.LENGTH and request.text(runner) == "hi"  # type: ignore[arg-type]


def test_text_that_a_detokenizer_rewrote_is_not_streamed_as_a_delta() -> None:
    class Rewriting(Letters):
        def detokenize(self, token_ids: Sequence[int]) -> str:
            return "XY" if len(token_ids) > 1 else "a"

    request, runner = ArRequest("r", {}, greedy(max_tokens=5)), Rewriting()
    request.take(step(0), runner, {STOP})  # type: ignore[arg-type]
    assert request.chunk(runner, emit_hidden=False).text == "a"  # type: ignore[arg-type,union-attr]
    request.take(step(1), runner, {STOP})  # type: ignore[arg-type]
    later = request.chunk(runner, emit_hidden=False)  # type: ignore[arg-type]
    assert later is not None and later.text == "" and later.token_ids == [1]
