"""The autoregressive scheduler, adapted to the Qwen2.5-Omni talker (as Qwen3-Omni's is):
it starts on the thinker's first stream chunk, its sampling is its own except that a
greedy request makes it greedy too, and every output carries its new codes for
``token2wav`` (``codes``, ``[n, 1]``), the result all of them and the spoken transcript."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from omnictl.models.qwen2_5_omni.talker import TalkerRunner
from omnictl.models.qwen3_omni.payloads import TalkerDelta, TalkerResult, extend
from omnictl.models.qwen3_omni.talker_scheduler import TalkerScheduler as Qwen3TalkerScheduler
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S
from omnictl.schedulers.autoregressive import AutoregressiveScheduler, StartOn

CODE_S = 2 * 240 / 24_000  # one code: two mel frames of 240 samples at 24 kHz, 20 ms


class TalkerScheduler(AutoregressiveScheduler):
    runner: TalkerRunner

    def __init__(
        self,
        runner: TalkerRunner,
        *,
        sampling: Mapping[str, Any],
        max_batch: int = 32,
        audio_policy: str = DEFAULT_POLICY,
        ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
    ) -> None:
        super().__init__(
            runner,
            start_on=StartOn.STREAM,
            max_batch=max_batch,
            default_sampling=sampling,
            audio_policy=audio_policy,
            audio_s_per_token=CODE_S,
            ttfp_target_s=ttfp_target_s,
        )

    # Only a request's greediness and seed reach the talker; the rest is its own.
    request_sampling = Qwen3TalkerScheduler.request_sampling

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        # A chunk's token ids are its new codes, the result's all of them.
        codes = torch.tensor([int(t) for t in data.token_ids], dtype=torch.long).reshape(-1, 1)
        if final:
            return extend(data, TalkerDelta, TalkerResult, codes=codes, transcript=self.runner.transcript(request_id))
        return extend(data, TalkerDelta, TalkerResult, codes=codes)

    def on_drop(self, request_id: str) -> None:
        self.runner.forget(request_id)
