from __future__ import annotations

from omnictl.stage.fanin import FanIn

ACTIVE = ("pre", "img", "aud", "agg")


def merge(inputs: dict) -> dict:
    return {"from": sorted(inputs)}


def test_waits_for_every_active_upstream() -> None:
    fanin = FanIn(("pre", "img", "aud"), merge)
    assert not fanin.arrive("r", ACTIVE, "pre", 1).ready
    assert not fanin.arrive("r", ACTIVE, "img", 2).ready
    assert len(fanin) == 1
    out = fanin.arrive("r", ACTIVE, "aud", 3)
    assert out.ready and out.data == {"from": ["aud", "img", "pre"]}
    assert len(fanin) == 0


def test_pruned_upstreams_are_not_expected() -> None:
    fanin = FanIn(("pre", "img", "aud"), merge)
    assert fanin.arrive("r", ("pre", "aud", "agg"), "pre", 1).ready is False
    assert fanin.arrive("r", ("pre", "aud", "agg"), "aud", 1).data == {"from": ["aud", "pre"]}


def test_skipped_branch_completes_the_fan_in_or_skips_the_stage() -> None:
    fanin = FanIn(("left", "right"), merge)
    assert not fanin.arrive("r", ("left", "right"), "left", 1).ready
    assert fanin.skip("r", ("left", "right"), "right").data == {"from": ["left"]}
    assert fanin.skip("s", ("left", "right"), "right").skipped is False
    assert fanin.skip("s", ("left", "right"), "left").skipped is True
    assert len(fanin) == 0


def test_drop_frees_partial_inputs() -> None:
    fanin = FanIn(("a", "b"), merge)
    fanin.arrive("r", ("a", "b"), "a", 1)
    fanin.drop("r")
    assert len(fanin) == 0 and not fanin.waiting("r")


def test_single_upstream_passes_straight_through() -> None:
    fanin = FanIn(("a",), None)
    assert fanin.arrive("r", ("a",), "a", {"x": 1}).data == {"x": 1}
    assert len(fanin) == 0
