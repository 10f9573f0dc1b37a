"""Sampling parameters, next-token choice and stop-string handling."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.schedulers.sampling import Sampler, SamplingParams, cut_at_stop, streamable_prefix


def test_defaults_then_request_values() -> None:
    params = SamplingParams.from_mapping({"max_tokens": 5, "stop": "END"}, defaults={"temperature": 0, "max_tokens": 9})
    assert params == SamplingParams(max_tokens=5, temperature=0.0, stop=("END",))
    assert SamplingParams.from_mapping(None) == SamplingParams()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"max_tokens": 0}, "sampling.max_tokens"),
        ({"max_tokens": "5"}, "sampling.max_tokens"),
        ({"temperature": -1}, "sampling.temperature"),
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"top_p": 0}, "sampling.top_p"),
        ({"top_k": True}, "sampling.top_k"),
        ({"seed": 1.5}, "sampling.seed"),
        ({"stop": [""]}, "sampling.stop[0]"),
        ({"stop": 3}, "sampling.stop"),
        ({"maxtokens": 3}, "sampling.maxtokens"),
        ([1, 2], "sampling"),
    ],
)
def test_bad_values_name_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams.from_mapping(raw)
    assert caught.value.field == field
    assert field.split(".")[-1] in str(caught.value)


def test_greedy_and_cuts() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == 1
    # top_k=1 and a tiny top_p leave only the best token, whatever the seed.
    for seed in range(20):
        assert Sampler(SamplingParams(temperature=5.0, top_k=1, seed=seed)).sample(logits) == 1
        assert Sampler(SamplingParams(temperature=5.0, top_p=0.01, seed=seed)).sample(logits) == 1
    # top_k=2 never picks outside the two best.
    picks = {Sampler(SamplingParams(temperature=50.0, top_k=2, seed=seed)).sample(logits) for seed in range(50)}
    assert picks == {1, 2}


def test_seed_gives_the_same_sequence() -> None:
    logits = torch.zeros(50)
    first = Sampler(SamplingParams(seed=3))
    second = Sampler(SamplingParams(seed=3))
    assert [first.sample(logits) for _ in range(10)] == [second.sample(logits) for _ in range(10)]


def test_stop_strings() -> None:
    assert cut_at_stop("hello world", ("wor", "lo")) == ("hel", True)
    assert cut_at_stop("hello", ("xyz",)) == ("hello", False)
    # A tail that may still become a stop string, or half a character, is held back.
    assert streamable_prefix("hello wo", ("world",)) == "hello "
    assert streamable_prefix("hello w", ("xyz",)) == "hello w"
    assert streamable_prefix("caf\ufffd", ()) == "caf"


KNOWN = ("max_tokens, temperature, top_p, top_k, min_p, seed, stop, frequency_penalty, presence_penalty, "
         "repetition_penalty, logit_bias, logprobs, top_logprobs")


@pytest.mark.parametrize(
    ("raw", "kwargs", "message", "field"),
    [
        ({"max_tokens": 0}, {}, "sampling.max_tokens: must be >= 1, got 0", "sampling.max_tokens"),
        ({"max_tokens": "5"}, {}, "sampling.max_tokens: expected an integer, got '5'", "sampling.max_tokens"),
        ({"temperature": -1}, {}, "sampling.temperature: must be >= 0.0, got -1", "sampling.temperature"),
        ({"temperature": float("inf")}, {}, "sampling.temperature: expected a number, got inf",
         "sampling.temperature"),
        ({"temperature": False}, {}, "sampling.temperature: expected a number, got False", "sampling.temperature"),
        ({"top_p": 1.5}, {}, "sampling.top_p: must be in (0, 1], got 1.5", "sampling.top_p"),
        ({"top_p": 0}, {}, "sampling.top_p: must be in (0, 1], got 0.0", "sampling.top_p"),
        ({"top_k": -1}, {}, "sampling.top_k: must be >= 0, got -1", "sampling.top_k"),
        ({"top_k": True}, {}, "sampling.top_k: expected an integer, got True", "sampling.top_k"),
        ({"seed": 1.5}, {}, "sampling.seed: expected an integer, got 1.5", "sampling.seed"),
        ({"stop": [""]}, {}, "sampling.stop[0]: must be a non-empty string, got ''", "sampling.stop[0]"),
        ({"stop": ["a", 3]}, {}, "sampling.stop[1]: must be a non-empty string, got 3", "sampling.stop[1]"),
        ({"stop": 3}, {}, "sampling.stop: expected a non-empty string or a list of them, got 3", "sampling.stop"),
        ({"x": 1}, {"where": "talker"}, f"talker.x: unknown sampling field (known: {KNOWN})", "talker.x"),
        (None, {"defaults": {"bogus": 1}}, f"default_sampling.bogus: unknown sampling field (known: {KNOWN})",
         "default_sampling.bogus"),
        ("s", {"where": "w"}, "w: expected an object, got str", "w"),
        ({}, {"defaults": [1]}, "default_sampling: expected an object, got list", "default_sampling"),
    ],
)
def test_each_refusal_says_which_field_where_and_what_came(raw: Any, kwargs: dict[str, Any], message: str,
                                                           field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams.from_mapping(raw, **kwargs)
    assert (str(caught.value), caught.value.field) == (message, field)


def test_values_kept_as_given_and_none_leaves_the_default() -> None:
    params = SamplingParams.from_mapping(
        {"temperature": 1, "seed": -3, "max_tokens": None, "stop": ("a", "b"), "top_k": 0, "top_p": 1},
        defaults={"max_tokens": 7, "top_p": 0.5})
    assert params == SamplingParams(max_tokens=7, temperature=1.0, top_p=1.0, top_k=0, seed=-3, stop=("a", "b"))
    assert type(params.temperature) is float and type(params.top_p) is float
    assert SamplingParams.from_mapping({"max_tokens": 1, "temperature": 0.0}).max_tokens == 1  # the minimum itself


def test_a_low_temperature_sharpens_the_distribution() -> None:
    logits = torch.tensor([1.0, 0.5])  # divided by 0.02: 25 apart, the second is never drawn
    assert {Sampler(SamplingParams(temperature=0.02, seed=seed)).sample(logits) for seed in range(40)} == {0}
    # at temperature 1 the second (38% likely) is drawn too
    assert {Sampler(SamplingParams(temperature=1.0, seed=seed)).sample(logits) for seed in range(40)} == {0, 1}


def test_top_p_keeps_the_smallest_head_that_reaches_it() -> None:
    logits = torch.tensor([math.log(2), 0.0, 0.0])  # softmax: exactly 0.5, 0.25, 0.25
    # the first token alone holds half the mass: top_p 0.5 keeps it alone
    assert {Sampler(SamplingParams(top_p=0.5, seed=seed)).sample(logits) for seed in range(40)} == {0}
    assert {Sampler(SamplingParams(top_p=0.6, seed=seed)).sample(logits) for seed in range(60)} == {0, 1}
    assert {Sampler(SamplingParams(top_p=0.8, seed=seed)).sample(logits) for seed in range(60)} == {0, 1, 2}


def test_unseeded_samplers_draw_differently() -> None:
    logits = torch.zeros(1000)
    draws = [tuple(sampler.sample(logits) for _ in range(5)) for sampler in (Sampler(SamplingParams()),
                                                                               Sampler(SamplingParams()))]
    assert draws[0] != draws[1]  # each seeded from the OS, not a fixed default


def test_stop_strings_at_their_edges() -> None:
    assert cut_at_stop("abc", ("c", "a")) == ("", True)  # the earliest stop wins
    assert cut_at_stop("abc", ()) == ("abc", False)
    assert streamable_prefix("say EN", ("END",)) == "say "
    assert streamable_prefix("say E", ("END", "EX")) == "say "
    assert streamable_prefix("sa", ("xyz",)) == "sa"
    assert streamable_prefix("a\ufffd\ufffd", ()) == "a"
    assert streamable_prefix("END", ("ENDX",)) == ""


def test_a_stop_string_cuts_at_its_first_occurrence() -> None:
    assert cut_at_stop("abab", ("b",)) == ("a", True)
    assert cut_at_stop("xyxy", ("y", "x")) == ("", True)
