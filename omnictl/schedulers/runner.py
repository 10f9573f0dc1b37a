"""The contract between the autoregressive scheduler and a model runner.

A runner owns the weights and the per-request KV caches; the scheduler owns the
batch, sampling, stopping and streaming. Adding a model means writing a runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # torch stays out of the import path of the CLI
    import torch

    from omnictl.schedulers.detokenizer import TextDecoder


@dataclass(slots=True)
class StepOutput:
    logits: torch.Tensor  # [vocab]: scores for the next token of one request
    hidden: torch.Tensor | None = None  # [hidden]: last-layer state at that position, if the runner exposes it
    prompt_tokens: int | None = None  # set by `prefill`: how many positions the prompt took


class AutoregressiveRunner(Protocol):
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        """Build the request's KV cache from its prompt; return the first next-token scores."""
        ...

    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        """Advance every listed request by one token (one batched forward pass)."""
        ...

    def release(self, request_id: str) -> None:
        """Free the request's KV cache (on finish and on abort). Idempotent."""
        ...

    def stop_token_ids(self) -> set[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (empty for runners whose tokens are not text)."""
        ...

    def kv_slots(self) -> int:
        """How many requests hold a KV cache right now."""
        ...


@runtime_checkable
class TextDecodingRunner(Protocol):
    """Optional runner method: a decoder that turns one request's tokens into text a token
    at a time (without it, ``detokenize`` is asked for every token so far on each step)."""

    def text_decoder(self) -> TextDecoder:
        """A fresh decoder for one request's generated tokens."""
        ...


@runtime_checkable
class StreamFedRunner(Protocol):
    """Optional runner methods for requests whose input keeps arriving while they decode."""

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        """An upstream increment (``done``: the upstream finished; ``data`` may be None).

        May be called before ``prefill``; ``release`` must drop what was fed."""
        ...

    def ready(self, request_id: str) -> bool:
        """Whether the request may prefill (before its prefill) or take a decode step now."""
        ...


@runtime_checkable
class ChunkedPrefillRunner(Protocol):
    """Optional runner method: prefill a long prompt a part at a time.

    The scheduler calls it again and again (other requests' decode steps and aborts in
    between) until it returns the first output; ``release`` drops a prefill part-way."""

    def prefill_chunk(
        self, request_id: str, inputs: Mapping[str, Any], max_tokens: int
    ) -> tuple[int, StepOutput | None]:
        """Prefill at most ``max_tokens`` more prompt positions: (positions done, the
        first next-token output once the whole prompt is in, else None)."""
        ...
