"""omnictl.models.tensor_parallel: how a loader learns it runs as one rank of a group, and
the clear errors for models tensor parallelism cannot split (the sharded runs themselves
are in tests/runtime/test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from omnictl.exceptions import StartupError
from omnictl.models import tensor_parallel
from omnictl.models.tensor_parallel import RankInfo, building, check_divisible, engine_ranks, load_kwargs
from omnictl.schedulers.vllm_engine import VllmOptions
from omnictl.stage.build import make_scheduler
from omnictl.topology import loads

# SmolLM2-135M's attention: 9 heads, 3 KV heads (the voice assistant's thinker).
SMOLLM2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)


def test_outside_a_group_the_model_loads_whole() -> None:
    assert tensor_parallel.current() is None
    assert load_kwargs(SMOLLM2) == {} and engine_ranks() == 1


def test_two_ranks_cannot_split_smollm2_and_the_error_says_why() -> None:
    with pytest.raises(StartupError) as caught:
        check_divisible(SMOLLM2, 2, "thinker")
    message = str(caught.value)
    assert "stage 'thinker': tp_size 2 does not divide the model (llama: 9 attention heads, 3 KV heads)" in message
    check_divisible(SMOLLM2, 3, "thinker")  # three ranks can


def test_a_rank_joins_its_group_on_its_first_sharded_load() -> None:
    joins: list[str] = []
    info = RankInfo("lm", 0, 3, "cpu", join=lambda: joins.append("joined"))
    with building(info):
        assert tensor_parallel.current() is info
        shard = load_kwargs(SMOLLM2)
        load_kwargs(SMOLLM2)  # a second part of the model: the group is joined already
    assert tensor_parallel.current() is None
    assert joins == ["joined"] and info.joined and not info.engine
    config = shard["distributed_config"]
    assert (config.tp_plan, config.tp_size) == ("auto", 3)


def test_a_model_without_a_tp_plan_is_refused() -> None:
    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=2)
    config.base_model_tp_plan = None
    with building(RankInfo("lm", 0, 2, "cpu")), pytest.raises(StartupError, match="has no tensor-parallel plan"):
        load_kwargs(config)


def test_an_engine_takes_the_degree_and_omnictl_starts_no_ranks() -> None:
    info = RankInfo("lm", 0, 2, "cpu", join=lambda: pytest.fail("an engine's group must not be started"))
    with building(info):
        assert engine_ranks() == 2
    assert info.engine and not info.joined
    options = VllmOptions.from_mapping({"tensor_parallel_size": 2})
    assert options.engine_args("/models/x").tensor_parallel_size == 2
    with pytest.raises(ValueError, match="tensor_parallel_size: must be an integer >= 1"):
        VllmOptions.from_mapping({"tensor_parallel_size": 0})


def test_a_tp_stage_whose_factory_has_no_model_runner_fails_to_start_saying_so() -> None:
    topology = loads(
        "stages:\n  - {name: lm, factory: omnictl.models.examples.identity, terminal: true, tp_size: 2}\n"
    )
    with pytest.raises(StartupError, match="stage 'lm': tp_size 2, but its factory built a scheduler without"):
        make_scheduler(topology.stages["lm"], topology, None)
