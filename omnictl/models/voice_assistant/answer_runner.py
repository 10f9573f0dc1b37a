"""The thinker's runner: a causal LM shaped to give one short, spoken answer.

Small instruct models ramble, repeat themselves ("the opposite of heart is the opposite
of heart is …") and open with preambles. Three measured fixes, all per request and all
inside the runner (the scheduler's sampling stays model-agnostic):

- ``system_prompt``: put first when the conversation brings no system message of its own;
- ``repetition_penalty`` and ``no_repeat_ngram``: on the tokens *this answer* generated
  (not the prompt's: "The capital of France is Paris" must be free to repeat "France");
- ``max_sentences``: once the answer has said that many sentences, the only token left
  is end-of-answer, so a voice reply stops where the answer ends.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.voice_assistant.sentences import SentenceCounter, sentences_ended
from omnictl.schedulers.chat import with_system_prompt
from omnictl.schedulers.detokenizer import TextDecoder
from omnictl.schedulers.runner import StepOutput

# sentences_ended and with_system_prompt: where callers of this module have found them
__all__ = ["SpokenAnswerRunner", "penalize", "sentences_ended", "with_system_prompt"]


def penalize(
    logits: torch.Tensor, history: Sequence[int], repetition_penalty: float, no_repeat_ngram: int
) -> torch.Tensor:
    """``logits`` with tokens of ``history`` made less likely, and n-gram repeats made impossible."""
    if not history:
        return logits
    out = logits.clone()
    if repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=out.device)
        scores = out[seen]
        out[seen] = torch.where(scores > 0, scores / repetition_penalty, scores * repetition_penalty)
    n = no_repeat_ngram
    if n > 0 and len(history) >= n:
        prefix = tuple(history[len(history) - n + 1 :]) if n > 1 else ()
        banned = {history[i + n - 1] for i in range(len(history) - n + 1) if tuple(history[i : i + n - 1]) == prefix}
        if banned:
            out[torch.tensor(sorted(banned), dtype=torch.long, device=out.device)] = float("-inf")
    return out


class SpokenAnswerRunner(HFCausalLMRunner):
    """:class:`HFCausalLMRunner` with a default system prompt, repetition control and a sentence cap."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        system_prompt: str | None = None,
        repetition_penalty: float = 1.0,
        no_repeat_ngram: int = 0,
        max_sentences: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, tokenizer, **kwargs)
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty: must be > 0 (1.0 is off), got {repetition_penalty}")
        if no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram: must be >= 0 (0 is off), got {no_repeat_ngram}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences: must be >= 1 or null (no cap), got {max_sentences}")
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        if max_sentences is not None and eos is None:
            raise ValueError("max_sentences: the tokenizer has no end-of-sequence token to stop with")
        self.system_prompt = system_prompt
        self.repetition_penalty = repetition_penalty
        self.no_repeat_ngram = no_repeat_ngram
        self.max_sentences = max_sentences
        self._eos = eos
        self._generated: dict[str, list[int]] = {}
        # per request, with max_sentences: its text as it grows, and its sentences ended
        self._sentences: dict[str, tuple[TextDecoder, SentenceCounter]] = {}

    def prompt_inputs(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        if "messages" in inputs:
            inputs = {**inputs, "messages": with_system_prompt(inputs["messages"], self.system_prompt)}
        return super().prompt_inputs(inputs)

    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        output = super().prefill(request_id, inputs)
        self._generated[request_id] = []
        return output

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        outputs = super().decode(request_ids, token_ids)
        shaped = []
        for request_id, token, output in zip(request_ids, token_ids, outputs):
            history = self._generated.setdefault(request_id, [])
            history.append(int(token))
            logits = penalize(output.logits, history, self.repetition_penalty, self.no_repeat_ngram)
            if self.max_sentences is not None and self._answer_is_done(request_id, int(token)):
                logits = torch.full_like(logits, float("-inf"))
                logits[self._eos] = 0.0
            shaped.append(StepOutput(logits=logits, hidden=output.hidden, prompt_tokens=output.prompt_tokens))
        return shaped

    def release(self, request_id: str) -> None:
        self._generated.pop(request_id, None)
        self._sentences.pop(request_id, None)
        super().release(request_id)

    def _answer_is_done(self, request_id: str, token: int) -> bool:
        """Whether the answer has said ``max_sentences`` sentences with ``token``, its newest."""
        assert self.max_sentences is not None
        if request_id not in self._sentences:
            self._sentences[request_id] = (self.text_decoder(), SentenceCounter())
        decoder, counter = self._sentences[request_id]
        return counter.feed(decoder.step(token)) >= self.max_sentences
