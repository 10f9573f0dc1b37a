from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.coordinator.pruning import active_stages, select_terminals
from omnictl.exceptions import InvalidRequest
from omnictl.topology import load, loads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen():
    return load(REPO / "topologies" / "qwen3-omni.yaml")


def test_all_terminals_by_default(qwen) -> None:
    assert set(select_terminals(qwen, None)) == {"decode", "code2wav"}
    assert set(active_stages(qwen, ["decode", "code2wav"])) == set(qwen.stages)


def test_text_only_prunes_the_talker_and_vocoder(qwen) -> None:
    terminals = select_terminals(qwen, ["text"])
    assert terminals == ("decode",)
    active = active_stages(qwen, terminals)
    assert "talker_ar" not in active and "code2wav" not in active
    assert {"preprocessing", "image_encoder", "audio_encoder", "mm_aggregate", "thinker", "decode"} <= set(active)


def test_unknown_modality_names_what_is_available(qwen) -> None:
    with pytest.raises(InvalidRequest, match=r"produces \['audio', 'text'\]") as error:
        select_terminals(qwen, ["video"])
    assert error.value.field == "modalities"


# a streams to c, which nothing routes data to: c runs only because of that stream.
STREAM_ONLY = """
stages:
  - name: a
    factory: m.a
    next: [b]
    stream_to: [c]
  - name: b
    factory: m.b
    terminal: true
    modality: text
  - name: c
    factory: m.c
    terminal: true
    modality: audio
"""


def test_a_stage_reached_only_through_stream_to_runs_when_its_modality_is_asked_for() -> None:
    topology = loads(STREAM_ONLY, "t.yaml")
    assert select_terminals(topology, ["audio"]) == ("c",)
    assert active_stages(topology, ["c"]) == ("a", "c")
    assert active_stages(topology, ["b"]) == ("a", "b")
    assert active_stages(topology, ["b", "c"]) == ("a", "b", "c")


def test_an_empty_modalities_list_is_rejected_not_pruned_to_nothing(qwen) -> None:
    with pytest.raises(InvalidRequest, match=r"modalities \[\]: this topology produces \['audio', 'text'\]") as error:
        select_terminals(qwen, [])
    assert error.value.field == "modalities"
