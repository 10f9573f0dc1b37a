"""Replica placement: fewest in flight, skipping replicas that are down, one replica per process."""

from __future__ import annotations

import pytest

from omnictl.coordinator.placement import ReplicaPlacement
from omnictl.exceptions import PipelineDead
from omnictl.topology import loads

TOPOLOGY = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: rep, next: [c]}
  - {name: c, factory: m.c, process: rep, terminal: true}
processes:
  rep: {replicas: 3}
"""

ACTIVE = ("a", "b", "c")


def test_each_request_gets_the_replica_with_the_fewest_in_flight() -> None:
    placement = ReplicaPlacement(loads(TOPOLOGY))
    picks = [placement.assign(f"r{i}", ACTIVE, down=set()) for i in range(6)]
    assert all(set(p) == {"rep"} for p in picks)  # only replicated processes ride in the context
    assert sorted(p["rep"] for p in picks) == [0, 0, 1, 1, 2, 2]
    assert placement.in_flight == {"a": 6, "rep#0": 2, "rep#1": 2, "rep#2": 2}
    for i, pick in enumerate(picks):
        if pick["rep"] == 1:
            placement.release(f"r{i}")
    assert placement.assign("next", ACTIVE, down=set()) == {"rep": 1}
    assert placement.holders("rep#1") == ["next"]


def test_down_replicas_are_skipped_and_none_left_is_pipeline_dead() -> None:
    placement = ReplicaPlacement(loads(TOPOLOGY))
    assert {placement.assign(f"r{i}", ACTIVE, down={"rep#0", "rep#2"})["rep"] for i in range(4)} == {1}
    with pytest.raises(PipelineDead, match="every replica of process 'rep'"):
        placement.assign("x", ACTIVE, down={"rep#0", "rep#1", "rep#2"})
    assert "x" not in placement.holders("a")  # a refused request holds nothing
    # a request that does not touch the process is not refused
    assert placement.assign("y", ("a",), down={"rep#0", "rep#1", "rep#2"}) == {}


def test_ties_between_equally_loaded_replicas_rotate_instead_of_piling_on_the_first() -> None:
    placement = ReplicaPlacement(loads(TOPOLOGY))
    picks = []
    for i in range(6):  # each request ends before the next: every replica is always idle
        picks.append(placement.assign(f"r{i}", ACTIVE, down=set())["rep"])
        placement.release(f"r{i}")
    assert picks == [0, 1, 2, 0, 1, 2]


def test_a_tie_skips_a_down_replica_and_the_rotation_goes_on_after_it() -> None:
    placement = ReplicaPlacement(loads(TOPOLOGY))
    picks = []
    for i in range(4):
        picks.append(placement.assign(f"r{i}", ACTIVE, down={"rep#1"})["rep"])
        placement.release(f"r{i}")
    assert picks == [0, 2, 2, 0]  # turn 1 falls to the next up replica; never rep#1
    assert placement.in_flight == {"a": 0, "rep#0": 0, "rep#1": 0, "rep#2": 0}


def test_a_preferred_replica_is_taken_while_it_is_up_whatever_it_holds() -> None:
    placement = ReplicaPlacement(loads(TOPOLOGY))
    for i in range(3):
        placement.assign(f"r{i}", ACTIVE, down=set())  # one on each
    # a new replica taking its share of a backlog: every moved request lands there
    picks = [placement.assign(f"m{i}", ACTIVE, down=set(), prefer={"rep": "rep#2"})["rep"] for i in range(3)]
    assert picks == [2, 2, 2] and placement.in_flight["rep#2"] == 4
    # down, it is not taken: the fewest in flight again
    assert placement.assign("x", ACTIVE, down={"rep#2"}, prefer={"rep": "rep#2"})["rep"] in (0, 1)
