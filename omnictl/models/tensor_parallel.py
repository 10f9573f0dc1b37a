"""Which tensor-parallel rank this process is, and how a model loader shards for it.

A stage with ``tp_size`` N builds its scheduler while :func:`current` says which rank this
is (see :mod:`omnictl.stage.tp_group`). Its factory then does one of two things:

- loads its model through :func:`load_kwargs` (``HFCausalLMRunner.from_pretrained`` and
  the Qwen3-Omni thinker do): the ``from_pretrained`` arguments that shard it with
  transformers' own tensor-parallel plan (``base_model_tp_plan``). On rank 0 the first call
  starts the follower ranks and joins them; the factory runs on every rank.
- hands the degree to an engine that runs its own ranks (:func:`engine_ranks`: vLLM's
  ``tensor_parallel_size``); omnictl then starts no process for the group.

Outside a group both give the single-process answer ({} and 1).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from omnictl.exceptions import StartupError


@dataclass
class RankInfo:
    stage: str
    rank: int
    size: int
    device: str  # "cpu" or "cuda:N": where this rank's shard lives
    join: Callable[[], None] | None = None  # rank 0: start the followers and join them (once)
    joined: bool = False  # a model was sharded over the group
    engine: bool = False  # an engine runs the ranks itself

    def join_group(self) -> None:
        if not self.joined and self.join is not None:
            self.join()
        self.joined = True


_current: RankInfo | None = None


def current() -> RankInfo | None:
    """The rank being built now (None: not in a tensor-parallel group)."""
    return _current


@contextmanager
def building(info: RankInfo) -> Iterator[None]:
    """Mark this process as rank ``info.rank`` while its stage's factory runs."""
    global _current
    previous, _current = _current, info
    try:
        yield
    finally:
        _current = previous


def check_divisible(config: Any, size: int, stage: str) -> None:
    """Attention heads, KV heads and (MoE) experts must split evenly over the ranks:
    transformers' plans shard them by column, and an uneven split fails deep inside the
    first forward pass with a reshape error that names neither the model nor the cause."""
    text = getattr(config, "text_config", None) or config
    counts = {
        "attention heads": getattr(text, "num_attention_heads", None),
        "KV heads": getattr(text, "num_key_value_heads", None),
        "MLP width": getattr(text, "intermediate_size", None),
    }
    uneven = {what: n for what, n in counts.items() if isinstance(n, int) and n % size}
    if uneven:
        what = ", ".join(f"{n} {name}" for name, n in uneven.items())
        model = getattr(config, "model_type", type(config).__name__)
        raise StartupError(
            f"stage {stage!r}: tp_size {size} does not divide the model ({model}: {what}); "
            "tensor parallelism splits each over the ranks",
            hint="pick a tp_size that divides the attention heads and the KV heads",
        )


def load_kwargs(config: Any) -> dict[str, Any]:
    """Extra ``from_pretrained`` arguments for this rank: its shard of the model's
    tensor-parallel plan, or nothing outside a group."""
    info = current()
    if info is None:
        return {}
    from transformers.distributed import DistributedConfig

    plan = getattr(getattr(config, "text_config", None) or config, "base_model_tp_plan", None)
    if not plan:
        raise StartupError(
            f"stage {info.stage!r}: {getattr(config, 'model_type', type(config).__name__)} has no "
            "tensor-parallel plan in transformers (`base_model_tp_plan`), so it cannot be sharded",
            hint="drop `tp_size`, or use a model that has one (Llama, Qwen2/3, Qwen3-Omni, ...)",
        )
    check_divisible(config, info.size, info.stage)
    info.join_group()
    return {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=info.size)}


def engine_ranks() -> int:
    """The tensor-parallel degree for an engine that starts its own ranks (1 outside a group)."""
    info = current()
    if info is None:
        return 1
    info.engine = True
    return info.size
