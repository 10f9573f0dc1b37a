"""Fixtures: a tiny real transformers model and tokenizer, built in memory."""

from __future__ import annotations

from typing import Any

import pytest

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.tiny_causal_lm import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def endless_model() -> Any:
    """A tiny model without an end token: requests end by max_tokens or stop strings only."""
    return tiny_llama(seed=1, eos=False)


@pytest.fixture()
def runner(endless_model: Any, tokenizer: Any) -> HFCausalLMRunner:
    return HFCausalLMRunner(endless_model, tokenizer, hidden_layer=-1)
