"""One request's state inside the autoregressive scheduler: tokens, text, finishing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.schedulers.sampling import Sampler, SamplingParams, cut_at_stop, streamable_prefix

if TYPE_CHECKING:
    from omnictl.schedulers.runner import AutoregressiveRunner, StepOutput


class ArRequest:
    def __init__(
        self, request_id: str, inputs: Mapping[str, Any], params: SamplingParams, forced: Sequence[int] = ()
    ) -> None:
        """``forced``: tokens a caller already received from a lost attempt of this request
        (a replica died mid-stream): taken in order instead of sampling, and never streamed
        again, so the caller's text continues where it stopped."""
        self.request_id = request_id
        self.forced = list(forced)
        self.inputs = inputs
        self.params = params
        self.sampler = Sampler(params)
        self.prompt_tokens = 0
        self.token_ids: list[int] = []  # generated, without a final stop token
        self.hidden_rows: list[torch.Tensor] = []
        self.hidden_size = 0
        self.completion_tokens = 0
        self.last_token = -1  # the token fed to the next decode step
        self.finish_reason: FinishReason | None = None
        self.final_text: str | None = None  # set when a stop string ended the request
        self.sent_text = ""
        self.sent_tokens = 0
        self.steps_since_emit = 0
        self.emitted = False
        self.decode_steps = 0
        self.decode_seconds = 0.0

    def take(self, output: StepOutput, runner: AutoregressiveRunner, stop_ids: set[int]) -> None:
        """Sample the next token from ``output`` and decide whether the request is done."""
        if self.forced:
            self._force(output, runner)
            return
        token = self.sampler.sample(output.logits)
        self.completion_tokens += 1
        self.steps_since_emit += 1
        self.last_token = token
        if output.hidden is not None:
            self.hidden_size = int(output.hidden.shape[-1])
        if token in stop_ids:
            self.finish_reason = FinishReason.STOP
            return
        self.token_ids.append(token)
        if output.hidden is not None:
            self.hidden_rows.append(output.hidden)
        if self.params.stop:
            text, hit = cut_at_stop(runner.detokenize(self.token_ids), self.params.stop)
            if hit:
                self.finish_reason = FinishReason.STOP
                self.final_text = text
                return
        if self.completion_tokens >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH

    def _force(self, output: StepOutput, runner: AutoregressiveRunner) -> None:
        """Teacher forcing: the next token is the next one the caller already has; it counts
        as sent (what was streamed of it is what the text was then)."""
        token = self.forced.pop(0)
        self.completion_tokens += 1
        self.last_token = token
        self.token_ids.append(token)
        if output.hidden is not None:
            self.hidden_size = int(output.hidden.shape[-1])
            self.hidden_rows.append(output.hidden)
        self.sent_tokens = len(self.token_ids)
        self.sent_text = streamable_prefix(runner.detokenize(self.token_ids), self.params.stop)
        self.steps_since_emit = 0
        if self.completion_tokens >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH

    def text(self, runner: AutoregressiveRunner) -> str:
        """The whole text when finished, else the part that is safe to stream."""
        if self.final_text is not None:
            return self.final_text
        full = runner.detokenize(self.token_ids)
        return full if self.finish_reason is not None else streamable_prefix(full, self.params.stop)

    def chunk(self, runner: AutoregressiveRunner, emit_hidden: bool) -> TokenDelta | None:
        """The increment since the last chunk, or None when there is nothing new."""
        self.steps_since_emit = 0
        token_ids = self.token_ids[self.sent_tokens :]
        text = self.text(runner)
        # Detokenizers can rewrite earlier text as tokens arrive; stream only what extends what was sent.
        delta = text[len(self.sent_text) :] if text.startswith(self.sent_text) else ""
        if not token_ids and not delta:
            return None
        hidden = self._hidden(self.hidden_rows[self.sent_tokens :]) if emit_hidden else None
        chunk = TokenDelta(text=delta, token_ids=token_ids, hidden=hidden)
        self.sent_tokens = len(self.token_ids)
        self.sent_text += delta
        return chunk

    def result(self, runner: AutoregressiveRunner, emit_hidden: bool) -> TokenResult:
        return TokenResult(
            text=self.text(runner),
            finish_reason=self.finish_reason or FinishReason.STOP,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            token_ids=list(self.token_ids),
            hidden=self._hidden(self.hidden_rows) if emit_hidden else None,
        )

    def _hidden(self, rows: list[torch.Tensor]) -> torch.Tensor:
        if not rows:
            return torch.zeros(0, self.hidden_size)
        return torch.stack([row.reshape(-1) for row in rows])
