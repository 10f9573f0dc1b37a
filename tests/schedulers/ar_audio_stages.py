"""A stage for the AR scheduler's deadline test: the tiny real Llama, its decode steps
slowed on purpose (30 ms), one slot per round, each token counted as 1 s of audio."""

from __future__ import annotations

import time
from typing import Sequence

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.tiny_causal_lm import tiny_llama, tiny_tokenizer
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput

STEP_S = 0.03


class SlowRunner(HFCausalLMRunner):
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        time.sleep(STEP_S)  # a talker far slower than its batch of one: the round is the bottleneck
        return super().decode(request_ids, token_ids)


def slow_talker(audio_policy: str = "fifo") -> AutoregressiveScheduler:
    runner = SlowRunner(tiny_llama(seed=1, eos=False), tiny_tokenizer())
    return AutoregressiveScheduler(
        runner,
        max_batch=1,
        default_sampling={"max_tokens": 40, "temperature": 0.0},
        audio_policy=audio_policy,
        audio_s_per_token=1.0,
    )
