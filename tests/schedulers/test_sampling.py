"""Sampling parameters, next-token choice and stop-string handling."""

from __future__ import annotations

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
        ({"stop": [""]}, "sampling.stop"),
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
