"""The shipped spoken questions."""

from __future__ import annotations

import pytest

from omnictl.inputs import parse_request
from benchmarks.eval.samples import sample_names, sample_path, sample_question, sample_request, sample_text


def test_every_sample_is_a_small_16khz_recording_of_its_question() -> None:
    assert len(sample_names()) >= 4
    for name in sample_names():
        samples, rate = sample_question(name)
        assert rate == 16_000
        assert 0.8 < samples.size / rate < 3.5, name
        assert sample_path(name).stat().st_size < 100_000
        assert sample_text(name).endswith("?")
    assert sample_text("capital_of_france") == "What is the capital of France?"


def test_sample_requests_are_valid_model_inputs() -> None:
    request = parse_request(sample_request("capital_of_france", sampling={"max_tokens": 8}, voice="joe"))
    message = request.last_user_message()
    assert message is not None and len(message.audio()) == 1
    assert request.sampling.max_tokens == 8 and request.voice == "joe"


def test_unknown_sample_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match="capital_of_france"):
        sample_text("nope")
