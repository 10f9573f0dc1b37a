"""The autoregressive scheduler, adapted to the talker.

Three differences from the thinker's: the talker starts on the thinker's first stream
chunk (``start_on="stream"``); its sampling is its own (the request's ``max_tokens``
counts text tokens, not codec frames) except that a greedy request (temperature 0)
makes the talker greedy too; and every output carries the finished codec frames
(``codes``) for ``code2wav``, the result all of them plus the spoken ``transcript``.
All three go through the scheduler's public hooks.
"""

from __future__ import annotations

from typing import Any, Mapping

from omnictl.models.qwen3_omni.payloads import TalkerDelta, TalkerResult, extend
from omnictl.models.qwen3_omni.talker import TalkerRunner
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S
from omnictl.schedulers.autoregressive import AutoregressiveScheduler, StartOn
from omnictl.schedulers.sampling import SamplingParams

FRAME_S = 1920 / 24_000  # one codec frame: code2wav upsamples it 1920 times at 24 kHz, 80 ms


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
        # The talker's own sampling is the default every request starts from.
        super().__init__(
            runner,
            start_on=StartOn.STREAM,
            max_batch=max_batch,
            default_sampling=sampling,
            audio_policy=audio_policy,
            audio_s_per_token=FRAME_S,
            ttfp_target_s=ttfp_target_s,
        )

    def request_sampling(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Only a request's greediness and seed reach the talker; the rest is its own."""
        requested = params.get("sampling")
        if not isinstance(requested, Mapping):
            return requested  # None, or not an object: validation names it
        own: dict[str, Any] = {}
        if requested.get("temperature") == 0:
            own["temperature"] = 0.0
        if requested.get("seed") is not None:
            own["seed"] = requested["seed"]
        return own

    def on_start(self, request_id: str, sampling: SamplingParams) -> None:
        # A greedy talker also picks its residual codes greedily (what transformers does).
        self.runner.set_code_sampling(request_id, sampling.temperature > 0.0)

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        codes = self.runner.take_frames(request_id, final=final)
        if final:
            return extend(data, TalkerDelta, TalkerResult, codes=codes, transcript=self.runner.transcript(request_id))
        return extend(data, TalkerDelta, TalkerResult, codes=codes)

    def on_drop(self, request_id: str) -> None:
        self.runner.forget(request_id)  # frames and transcript too: no result will take them
