"""Per-request sampling: parameters parsed from a request, and next-token choice.

Temperature 0 is greedy (argmax) and therefore deterministic. Any other temperature
draws from the softmax with the request's own ``torch.Generator``, seeded from
``seed`` when given, so a seeded request gives the same tokens whatever else runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

import torch

from omnictl.sampling import SamplingParams as RequestSampling
from omnictl.sampling import refuse_unsupported

# What the HF runner's Sampler honours (the penalties, min_p, logit_bias and logprobs are vLLM's).
HF_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"})
HF_ENGINE = "the HF runner (factory_args.engine: hf)"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """A request's sampling resolved over its stage's defaults: every field has a value.

    Built by :meth:`from_mapping` from :class:`omnictl.sampling.SamplingParams`, the one
    place sampling fields are checked; a scheduler reads these and checks nothing."""

    max_tokens: int = 256
    temperature: float = 1.0  # OpenAI's default; 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any] | RequestSampling | None,
        *,
        defaults: Mapping[str, Any] | RequestSampling | None = None,
        where: str = "sampling",
        supported: Iterable[str] | None = None,
        engine: str = "this engine",
    ) -> SamplingParams:
        """``raw`` (a request's ``sampling``) over ``defaults`` (the stage's ``default_sampling``).

        Raises :class:`InvalidRequest` naming the offending field, e.g. ``sampling.top_p``
        (``default_sampling.top_p`` for a bad default); with ``supported``, also for a field
        set (to a value that changes something) that is not among them.
        """
        request = RequestSampling.from_mapping(raw, where=where)
        base = RequestSampling.from_mapping(defaults, where="default_sampling")
        if supported is not None:
            refuse_unsupported(base, supported, engine, where="default_sampling")
            refuse_unsupported(request, supported, engine, where=where)
        merged = request.over(base)
        names = {f.name for f in fields(cls)}
        values = {name: getattr(merged, name) for name in merged.given() if name in names}
        return cls(**values)


class Sampler:
    """Chooses one request's next tokens; holds its random generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._generator: torch.Generator | None = None
        if params.temperature > 0.0:
            self._generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self._generator.manual_seed(params.seed)
            else:
                self._generator.seed()

    def sample(self, logits: torch.Tensor) -> int:
        """Next token id from ``logits`` (shape ``[vocab]``)."""
        scores = logits.detach().to(device="cpu", dtype=torch.float32).reshape(-1)
        if self._generator is None:
            return int(torch.argmax(scores).item())
        scores = scores / self.params.temperature
        if 0 < self.params.top_k < scores.numel():
            kth_best = torch.topk(scores, self.params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth_best, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest head whose mass reaches top_p; the best token always stays.
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= self.params.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator).item())


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one occurred."""
    cut = min((index for index in (text.find(s) for s in stop) if index >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def streamable_prefix(text: str, stop: tuple[str, ...]) -> str:
    """The part of ``text`` that is safe to stream now.

    Held back: a trailing replacement character (a multi-byte character whose bytes
    have not all been generated yet) and a tail that could still grow into a stop
    string (streamed text must never contain the stop string).
    """
    end = len(text.rstrip("\ufffd"))
    for s in stop:
        for length in range(min(len(s) - 1, end), 0, -1):
            if text[end - length : end] == s[:length]:
                end -= length
                break
    return text[:end]
