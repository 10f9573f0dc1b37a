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

from typing import Any

from omnictl.exceptions import StartupError

# Which rank this process is: the stage sets it (omnictl/stage/tp_rank.py), model loaders read it.
from omnictl.stage.tp_rank import RankInfo as RankInfo
from omnictl.stage.tp_rank import building as building
from omnictl.stage.tp_rank import current as current


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
