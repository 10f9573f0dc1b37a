"""omnictl.sampling: the one validated sampling type (issue 41). Every construction is
checked (the HTTP layer's, a realtime session's, the one a stage process makes when the
request arrives), a request's fields lie over a stage's defaults, and an engine refuses
by name what it cannot honour."""

from __future__ import annotations

import pytest

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import parse_request
from omnictl.outputs import TokenLogprob, TokenResult, TopLogprob
from omnictl.sampling import SamplingParams, refuse_unsupported
from omnictl.transports.packing import pack, unpack


def across(value: object) -> object:
    """``value`` as a stage process receives it (msgpack, WireStructs rebuilt)."""
    packed = pack(value)
    assert packed.layout == ()  # no tensors here: the skeleton is everything
    return unpack(packed.skeleton, packed.layout, b"")


def test_a_direct_construction_is_checked_too() -> None:
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams(top_p=2.0)
    assert caught.value.field == "sampling.top_p"
    with pytest.raises(InvalidRequest, match="sampling.top_logprobs: needs logprobs: true"):
        SamplingParams(top_logprobs=2)
    assert SamplingParams(stop=["a"]).stop == ("a",)  # type: ignore[arg-type]  # a list, as msgpack hands it back


def test_it_crosses_processes_as_itself_and_so_do_logprobs() -> None:
    request = parse_request({"messages": [{"role": "user", "content": "x"}],
                             "sampling": {"logit_bias": {"5": 1}, "logprobs": True, "top_logprobs": 2, "stop": "."}})
    assert across(request) == request and across(request.sampling) == request.sampling
    result = TokenResult(text="h", logprobs=[TokenLogprob(token="h", logprob=-0.1, bytes=[104],
                                                          top_logprobs=[TopLogprob(token="h", logprob=-0.1)])])
    arrived = across(result)
    assert arrived == result and isinstance(arrived, TokenResult) and isinstance(arrived.logprobs[0], TokenLogprob)


def test_a_request_lies_over_the_defaults_and_as_dict_is_what_it_sets() -> None:
    defaults = SamplingParams(max_tokens=32, temperature=0.0, min_p=0.1)
    request = SamplingParams(temperature=0.7, logit_bias={3: -1.0}, stop=("\n",))
    merged = request.over(defaults)
    assert merged == SamplingParams(max_tokens=32, temperature=0.7, min_p=0.1, logit_bias={3: -1.0}, stop=("\n",))
    assert request.given() == ["temperature", "stop", "logit_bias"]
    assert request.as_dict() == {"temperature": 0.7, "stop": ["\n"], "logit_bias": {3: -1.0}}
    assert SamplingParams().as_dict() == {}


def test_an_engine_refuses_what_it_cannot_honour_and_takes_what_changes_nothing() -> None:
    basic = ("max_tokens", "temperature")
    refuse_unsupported(SamplingParams(temperature=0.5, frequency_penalty=0.0, repetition_penalty=1.0, logprobs=False,
                                      min_p=0.0, logit_bias={}), basic, "this engine")
    with pytest.raises(InvalidRequest) as caught:
        refuse_unsupported(SamplingParams(temperature=0.5, presence_penalty=0.1), basic, "the HF runner")
    assert caught.value.field == "sampling.presence_penalty"
    assert str(caught.value).startswith("sampling.presence_penalty: the HF runner cannot honour this field")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"seed": 2**64}, "sampling.seed"),
        ({"logit_bias": {"-1": 1}}, "sampling.logit_bias"),
        # token ids past 32 bits: a key of 2^64 or more could not be carried to a stage (a 500);
        # a 5,000-digit one made int() itself raise (a 500 before any stage)
        ({"logit_bias": {str(2**64): 1}}, "sampling.logit_bias"),
        ({"logit_bias": {str(2**31): 1}}, "sampling.logit_bias"),
        ({"logit_bias": {"9" * 5000: 1}}, "sampling.logit_bias"),
        ({"logit_bias": {2**70: 1}}, "sampling.logit_bias"),
        ({"logit_bias": {-(2**70): 1}}, "sampling.logit_bias"),
        ({"logit_bias": {str(-(2**70)): 1}}, "sampling.logit_bias"),
        ({"logit_bias": {"1": float("nan")}}, "sampling.logit_bias.1"),
        ({"min_p": -0.1}, "sampling.min_p"),
        ({"repetition_penalty": 2.5}, "sampling.repetition_penalty"),
        ({"temperature": 2.5}, "sampling.temperature"),
        ({"logprobs": 1}, "sampling.logprobs"),
    ],
)
def test_out_of_range_values_are_named(raw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams.from_mapping(raw)
    assert caught.value.field == field and str(caught.value).startswith(field)


def test_a_logit_bias_key_is_any_32_bit_token_id_and_a_refused_one_is_shown_clipped() -> None:
    bias = SamplingParams.from_mapping({"logit_bias": {"0": 1, "2147483647": -1, "000050256": 2}}).logit_bias
    assert bias == {0: 1.0, 2**31 - 1: -1.0, 50256: 2.0}
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams.from_mapping({"logit_bias": {"9" * 5000: 1}})
    assert str(caught.value) == (f"sampling.logit_bias: keys must be token ids (integers 0 to 2147483647), got "
                                 f"{'9' * 64!r}... (5000 characters)")
    with pytest.raises(InvalidRequest, match="got an integer of 71 bits$"):
        SamplingParams.from_mapping({"logit_bias": {2**70: 1}})
