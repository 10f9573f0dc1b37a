from __future__ import annotations

import pytest

from omnictl.stage.router import RouteContractError, Router
from omnictl.topology.model import StageSpec

SPEC = StageSpec(name="r", factory="x.y", next=("audio", "video"), route_fn="x.route")


def test_static_routing_keeps_only_active_targets() -> None:
    router = Router(StageSpec(name="s", factory="x.y", next=("a", "b")), None, {})
    assert router.targets({}, ("s", "a")) == (["a"], [])


def test_dynamic_routing_reports_the_candidates_left_out() -> None:
    router = Router(SPEC, lambda data: data["to"], {})
    assert router.targets({"to": "video"}, ("r", "audio", "video")) == (["video"], ["audio"])
    assert router.targets({"to": ["audio", "video"]}, ("r", "audio", "video")) == (["audio", "video"], [])


@pytest.mark.parametrize(("value", "why"), [
    (None, "it must return one or more of ['audio', 'video']"),
    ([], "it must return one or more of ['audio', 'video']"),
    ("", "[''] not declared in its `next` ['audio', 'video']"),
    (3, "it must return one or more of ['audio', 'video']"),
    ("subtitles", "['subtitles'] not declared in its `next` ['audio', 'video']"),
    (["audio", "subtitles"], "['subtitles'] not declared in its `next` ['audio', 'video']"),
])
def test_contract_violations_name_the_stage_and_the_value(value: object, why: str) -> None:
    router = Router(SPEC, lambda data: value, {})
    with pytest.raises(RouteContractError) as error:
        router.targets({}, ("r", "audio", "video"))
    assert str(error.value) == f"route_fn of stage 'r' returned {value!r}{';' if 'must' in why else ':'} {why}"


def test_projection_and_fan_out_isolation() -> None:
    router = Router(StageSpec(name="t", factory="x.y", next=("dec", "talk")), None, {"dec": lambda d: {"ids": d["ids"]}})
    data = {"ids": [1, 2], "hidden": "big"}
    assert router.payload_for("dec", data, fan_out=True) == {"ids": [1, 2]}
    talk = router.payload_for("talk", data, fan_out=True)
    talk["ids"].append(3)
    assert data["ids"] == [1, 2]
