"""The worker start-up configuration crosses as typed msgpack, not pickle."""

from __future__ import annotations

import dataclasses
import pickle
import sys

import pytest

from omnictl.stage.startup import WorkerConfig, decode_config, encode_config
from omnictl.topology import load
from tests.serving.harness import FAST_TOPOLOGY


def test_the_configuration_comes_back_as_the_same_typed_values() -> None:
    topology = load(FAST_TOPOLOGY)
    config = WorkerConfig("heads", "heads", topology, None, {"heads": "ipc:///tmp/x/p0"}, "ipc://c", "ipc://b",
                          None, 1234, tuple(sys.path[:2]))
    raw = encode_config(config)
    assert pickle.PROTO not in raw[:2] and b"omnictl.topology" not in raw  # no class paths: nothing to import or run
    back = decode_config(raw)
    assert back == config
    assert type(back.topology.stages["answer"]) is type(topology.stages["answer"])
    assert back.topology.path == topology.path


def test_a_value_with_no_place_in_a_configuration_is_refused_naming_its_type() -> None:
    class Weights:
        pass

    topology = load(FAST_TOPOLOGY)
    stage = topology.stages["answer"]
    odd = dataclasses.replace(topology, stages={**topology.stages, "answer": dataclasses.replace(
        stage, factory_args={"weights": Weights()})})
    config = WorkerConfig("heads", "heads", odd, None, {}, "ipc://c", "ipc://b", None, 1, ())
    with pytest.raises(NotImplementedError, match="^a Weights has no place in a worker's configuration$"):
        encode_config(config)
