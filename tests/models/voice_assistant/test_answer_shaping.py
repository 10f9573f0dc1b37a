"""The pieces that shape and score a spoken answer, without the models."""

from __future__ import annotations

import torch

from omnictl.models.voice_assistant.answer_runner import penalize, sentences_ended, with_system_prompt
from benchmarks.eval.quality import Question, first_sentence, is_correct, word_errors


def test_a_sentence_ends_at_its_punctuation_not_inside_a_number() -> None:
    assert sentences_ended("The capital of France is Paris.") == 1
    assert sentences_ended("Pi is about 3.") == 0  # "3." may still become "3.14"
    assert sentences_ended("Pi is about 3.14") == 0
    assert sentences_ended("Yes! It is blue. Really") == 2
    assert sentences_ended("Paris\n") == 1


def test_the_system_prompt_goes_first_unless_the_caller_brings_one() -> None:
    asked = [{"role": "user", "content": "hi"}]
    assert with_system_prompt(asked, "Be brief.") == [{"role": "system", "content": "Be brief."}, *asked]
    own = [{"role": "system", "content": "Mine."}, *asked]
    assert with_system_prompt(own, "Be brief.") == own
    assert with_system_prompt(asked, None) == asked


def test_repeated_tokens_lose_score_and_a_repeated_ngram_is_impossible() -> None:
    logits = torch.tensor([2.0, -1.0, 1.0, 0.5])
    penalized = penalize(logits, [0, 1], repetition_penalty=2.0, no_repeat_ngram=0)
    assert penalized.tolist() == [1.0, -2.0, 1.0, 0.5]
    # history 2 3 2: the bigram (2, 3) was said, so after 2 the token 3 is banned
    banned = penalize(logits, [2, 3, 2], repetition_penalty=1.0, no_repeat_ngram=2)
    assert banned[3] == float("-inf") and banned[:3].tolist() == logits[:3].tolist()
    assert penalize(logits, [], 2.0, 2) is logits


def test_an_answer_counts_when_its_first_sentence_says_it() -> None:
    planet = Question("What is the largest planet?", ("Jupiter",))
    assert is_correct("Jupiter is the largest planet.", planet)
    assert not is_correct("It is Neptune. Actually, Jupiter.", planet)
    assert not is_correct("Jupiterian moons are big.", planet)  # whole words only
    assert first_sentence("Paris. It is in France.") == "Paris."


def test_word_error_rate_counts_edits_over_reference_words() -> None:
    assert word_errors("What is the capital of France?", "what is the capital of france") == (0, 6)
    assert word_errors("What is the capital of France?", "What is capital on France") == (2, 6)
