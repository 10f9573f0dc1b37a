"""Per-request sampling: parameters parsed from a request, and next-token choice.

Temperature 0 is greedy (argmax) and therefore deterministic. Any other temperature
draws from the softmax with the request's own ``torch.Generator``, seeded from
``seed`` when given, so a seeded request gives the same tokens whatever else runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from omnictl.exceptions import InvalidRequest

_KNOWN_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # OpenAI's default; 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any] | None, *, defaults: Mapping[str, Any] | None = None, where: str = "sampling"
    ) -> SamplingParams:
        """Validate ``raw`` (a request's ``sampling`` object) on top of ``defaults``.

        Raises :class:`InvalidRequest` naming the offending field, e.g. ``sampling.top_p``.
        """
        merged: dict[str, Any] = {}
        for source_name, source in (("defaults", defaults), (where, raw)):
            if source is None:
                continue
            if not isinstance(source, Mapping):
                raise InvalidRequest(f"{where}: expected an object, got {type(source).__name__}", field=where)
            for key, value in source.items():
                if key not in _KNOWN_FIELDS:
                    raise InvalidRequest(
                        f"{source_name}.{key}: unknown sampling field (known: {', '.join(_KNOWN_FIELDS)})",
                        field=f"{where}.{key}",
                    )
                if value is not None:
                    merged[key] = value
        base = cls()
        params = cls(
            max_tokens=_int(merged, "max_tokens", base.max_tokens, where, minimum=1),
            temperature=_float(merged, "temperature", base.temperature, where, minimum=0.0),
            top_p=_float(merged, "top_p", base.top_p, where, minimum=0.0),
            top_k=_int(merged, "top_k", base.top_k, where, minimum=0),
            seed=_int(merged, "seed", None, where, minimum=None),
            stop=_stop(merged.get("stop"), where),
        )
        if params.top_p == 0.0 or params.top_p > 1.0:
            raise InvalidRequest(f"{where}.top_p: must be in (0, 1], got {params.top_p}", field=f"{where}.top_p")
        return params


def _int(values: Mapping[str, Any], key: str, default: int | None, where: str, *, minimum: int | None) -> Any:
    if key not in values:
        return default
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{where}.{key}: expected an integer, got {value!r}", field=f"{where}.{key}")
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"{where}.{key}: must be >= {minimum}, got {value}", field=f"{where}.{key}")
    return value


def _float(values: Mapping[str, Any], key: str, default: float, where: str, *, minimum: float) -> float:
    if key not in values:
        return default
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{where}.{key}: expected a number, got {value!r}", field=f"{where}.{key}")
    if value < minimum:
        raise InvalidRequest(f"{where}.{key}: must be >= {minimum}, got {value}", field=f"{where}.{key}")
    return float(value)


def _stop(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) and s for s in value):
        raise InvalidRequest(
            f"{where}.stop: expected a non-empty string or a list of them, got {value!r}", field=f"{where}.stop"
        )
    return tuple(value)


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
