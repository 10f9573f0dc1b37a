"""One request's state inside the autoregressive scheduler: tokens, hidden rows, finishing.

Its tokens become text by :class:`~omnictl.schedulers.detokenizer.TextGeneration`, the
text-generation path the vLLM scheduler uses too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

import torch

from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.schedulers.detokenizer import TextGeneration, WholeDecoder
from omnictl.schedulers.runner import TextDecodingRunner
from omnictl.schedulers.sampling import Sampler, SamplingParams

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
        self.hidden_rows: list[torch.Tensor] = []
        self.hidden_size = 0
        self.last_token = -1  # the token fed to the next decode step
        self.steps_since_emit = 0
        self.emitted = False
        self.decode_steps = 0
        self.decode_seconds = 0.0
        self._generation: TextGeneration | None = None  # made with the first token (the runner's decoder)

    def take(self, output: StepOutput, runner: AutoregressiveRunner, stop_ids: set[int]) -> None:
        """Sample the next token from ``output`` and decide whether the request is done."""
        generation = self._text(runner, stop_ids)
        if self.forced:
            self._force(output, generation)
            return
        token = self.sampler.sample(output.logits)
        self.steps_since_emit += 1
        self.last_token = token
        if output.hidden is not None:
            self.hidden_size = int(output.hidden.shape[-1])
        generation.add(token)
        if output.hidden is not None and len(self.hidden_rows) < len(generation.token_ids):
            self.hidden_rows.append(output.hidden)  # a stop token's row is not kept

    def _force(self, output: StepOutput, generation: TextGeneration) -> None:
        """Teacher forcing: the next token is the next one the caller already has; it counts
        as sent (what was streamed of it is what the text was then)."""
        token = self.forced.pop(0)
        self.last_token = token
        if output.hidden is not None:
            self.hidden_size = int(output.hidden.shape[-1])
            self.hidden_rows.append(output.hidden)
        generation.force(token)
        self.steps_since_emit = 0

    @property
    def token_ids(self) -> list[int]:
        """Generated, without a final stop token."""
        return self._generation.token_ids if self._generation is not None else []

    @property
    def completion_tokens(self) -> int:
        return self._generation.completion_tokens if self._generation is not None else 0

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._generation.finish_reason if self._generation is not None else None

    @property
    def final_text(self) -> str | None:
        """Set when a stop string ended the request."""
        return self._generation.final_text if self._generation is not None else None

    @property
    def sent_tokens(self) -> int:
        return self._generation.sent_tokens if self._generation is not None else 0

    @property
    def sent_text(self) -> str:
        return self._generation.sent_text if self._generation is not None else ""

    def text(self, runner: AutoregressiveRunner) -> str:
        """The whole text when finished, else the part that is safe to stream."""
        return self._text(runner).text()

    def chunk(self, runner: AutoregressiveRunner, emit_hidden: bool) -> TokenDelta | None:
        """The increment since the last chunk, or None when there is nothing new."""
        self.steps_since_emit = 0
        generation = self._text(runner)
        sent_tokens = generation.sent_tokens
        chunk = generation.chunk()
        if chunk is not None and emit_hidden:
            chunk.hidden = self._hidden(self.hidden_rows[sent_tokens:])
        return chunk

    def result(self, runner: AutoregressiveRunner, emit_hidden: bool) -> TokenResult:
        result = self._text(runner).result(self.prompt_tokens)
        if emit_hidden:
            result.hidden = self._hidden(self.hidden_rows)
        return result

    def _text(self, runner: AutoregressiveRunner, stop_ids: Collection[int] = ()) -> TextGeneration:
        """This request's text generation, made on first use with the runner's decoder."""
        if self._generation is None:
            decoder = (
                runner.text_decoder() if isinstance(runner, TextDecodingRunner) else WholeDecoder(runner.detokenize)
            )
            self._generation = TextGeneration(self.params, decoder, stop_ids)
        return self._generation

    def _hidden(self, rows: list[torch.Tensor]) -> torch.Tensor:
        if not rows:
            return torch.zeros(0, self.hidden_size)
        return torch.stack([row.reshape(-1) for row in rows])
