"""A follower rank's loop in the test process, each test well under a second: it runs rank
0's calls in order, answers the KV slot count, ends when rank 0 says stop, and leaves the
group (exit code 3) when its last call and rank 0's ended differently. The broadcasts rank 0
would make are scripted (a stand-in for ``torch.distributed``'s two calls the loop makes);
a group of real follower processes is tests/models/test_tensor_parallel.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from omnictl.stage import tp_follower
from omnictl.stage.tp_follower import _exit_with_parent, follow


class Exits(Exception):
    pass


class Runner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def prefill(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("prefill", args, kwargs))
        if args == ("bad",):
            raise ValueError("bad input")

    def decode(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("decode", args, kwargs))

    def kv_slots(self) -> float:
        return 7.0


GROUP = object()  # the ops group rank 0 set up


@pytest.fixture()
def rank0(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], list[int]]:
    """(what rank 0 will broadcast, what this rank gathered to it, exit codes)."""
    script: list[Any] = []
    gathered: list[Any] = []
    exits: list[int] = []

    def broadcast_object_list(box: list[Any], src: int = 0, group: Any = None) -> None:
        assert src == 0 and group is GROUP and box == [None]
        box[0] = script.pop(0)

    def gather_object(obj: Any, object_gather_list: Any = None, dst: int = 0, group: Any = None) -> None:
        assert dst == 0 and group is GROUP and object_gather_list is None
        gathered.append(obj)

    def exit_now(code: int) -> None:
        exits.append(code)
        raise Exits

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    monkeypatch.setattr(dist, "gather_object", gather_object)
    monkeypatch.setattr(tp_follower.os, "_exit", exit_now)
    return script, gathered, exits


def test_the_follower_runs_rank_0_calls_in_order_until_told_to_stop(rank0: tuple[list[Any], list[Any], list[int]]) -> None:
    script, gathered, exits = rank0
    runner = Runner()
    script += [("prefill", ("a",), {"n": 1}, False), ("kv_slots", (), {}, False), ("decode", (["a"],), {}, False),
               None, ("decode", (), {}, False)]
    follow(runner, GROUP, 1, "llm")
    assert runner.calls == [("prefill", ("a",), {"n": 1}), ("decode", (["a"],), {})]
    assert gathered == [7] and type(gathered[0]) is int and exits == []
    assert script == [("decode", (), {}, False)]  # nothing read after the stop


def test_a_call_that_fails_on_both_ranks_is_followed_by_the_next(rank0: tuple[list[Any], list[Any], list[int]]) -> None:
    script, _, exits = rank0
    runner = Runner()
    script += [("prefill", ("bad",), {}, False), ("decode", (), {}, True), ("decode", (), {}, False), None]
    follow(runner, GROUP, 1, "llm")
    assert [call[0] for call in runner.calls] == ["prefill", "decode", "decode"] and exits == []


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ([("prefill", ("bad",), {}, False), ("decode", (), {}, False)], "the last call failed here but succeeded on rank 0"),
        ([("prefill", ("ok",), {}, False), ("decode", (), {}, True)], "the last call succeeded here but failed on rank 0"),
    ],
)
def test_ranks_that_parted_ways_end_the_group(rank0: tuple[list[Any], list[Any], list[int]], script: list[Any],
                                              said: str, caplog: pytest.LogCaptureFixture) -> None:
    rank0[0].extend(script)
    with pytest.raises(Exits):
        follow(Runner(), GROUP, 2, "llm")
    assert rank0[2] == [3]
    assert f"stage 'llm' rank 2: {said}; the group must restart" in caplog.text


def test_a_follower_exits_once_rank_0_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    parents = iter([40, 40, 1])
    slept: list[float] = []
    monkeypatch.setattr(tp_follower.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(tp_follower.time, "sleep", slept.append)

    def exit_now(code: int) -> None:
        raise Exits(code)

    monkeypatch.setattr(tp_follower.os, "_exit", exit_now)
    with pytest.raises(Exits) as caught:
        _exit_with_parent(40)
    assert caught.value.args == (0,) and slept == [0.5, 0.5]
