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

    # torch's own defaults are no source rank and no gather list: the follower names both
    def broadcast_object_list(box: list[Any], *, src: int, group: Any) -> None:
        assert src == 0 and group is GROUP and box == [None]
        box[0] = script.pop(0)

    def gather_object(obj: Any, object_gather_list: Any, *, dst: int, group: Any) -> None:
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
    [line] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert line.getMessage() == f"stage 'llm' rank 2: {said}; the group must restart"


def test_a_call_that_fails_here_is_logged_once_at_debug_as_rank_0_fails_it_too(
        rank0: tuple[list[Any], list[Any], list[int]], caplog: pytest.LogCaptureFixture) -> None:
    rank0[0].extend([("prefill", ("bad",), {}, False), None])
    with caplog.at_level("DEBUG", logger=tp_follower.log.name):
        follow(Runner(), GROUP, 1, "llm")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "stage 'llm' rank 1: prefill raised ValueError: bad input (as on rank 0)")]


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


# --- main: the follower process's start, in this process ------------------------------------


class Scheduler:
    def __init__(self, runner: Any) -> None:
        self.runner = runner


@pytest.mark.parametrize("has_runner", [True, False])
def test_main_joins_as_its_rank_builds_its_shard_then_follows(monkeypatch: pytest.MonkeyPatch, has_runner: bool) -> None:
    import io
    import os
    import pickle
    import sys
    import types

    from omnictl import logs
    from omnictl.models import tensor_parallel
    from omnictl.stage import build, tp_group
    from omnictl.stage.tp_group import FollowerConfig
    from omnictl.topology import loads

    topology = loads("stages:\n  - {name: llm, factory: tests.stage.build_factories.double, terminal: true, tp_size: 2}\n")
    master = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    config = FollowerConfig(stage="llm", topology=topology, model_path="/models/m", rank=1, size=2,
                            store_port=int(master.port), backend="gloo", parent_pid=os.getppid(),
                            sys_path=["/from/rank0", sys.path[0]], log_level="DEBUG", log_format="json")
    done: list[Any] = []
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(pickle.dumps(config))))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(logs, "configure_stage_process", lambda *args: done.append(("logs", args)))

    class Thread:
        def __init__(self, target: Any, args: tuple[Any, ...], daemon: bool) -> None:
            done.append(("watch", target, args, daemon))

        def start(self) -> None:
            done.append("watching")

    monkeypatch.setattr(tp_follower, "threading", types.SimpleNamespace(Thread=Thread))

    def join(store: Any, spec: Any, rank: int) -> Any:
        store.set("seen", "1")  # a client of rank 0's store, on its port
        done.append(("join", spec.name, rank))
        return GROUP

    monkeypatch.setattr(tp_group, "join", join)
    runner = Runner()

    def call_factory(spec: Any, topology_: Any, model_path: Any, device: str) -> Any:
        info = tensor_parallel.current()  # built as rank 1 of the group
        assert info is not None and (info.stage, info.rank, info.size, info.device) == ("llm", 1, 2, device)
        done.append(("build", spec.name, topology_ == topology, model_path, device))
        return Scheduler(runner if has_runner else None)

    monkeypatch.setattr(build, "call_factory", call_factory)
    monkeypatch.setattr(tp_follower, "follow", lambda *args: done.append(("follow", *args)))

    def exit_now(code: int) -> None:
        raise Exits(code)

    monkeypatch.setattr(tp_follower.os, "_exit", exit_now)
    with pytest.raises(Exits) as caught:
        tp_follower.main()
    assert master.get("seen") == b"1"
    assert sys.path[:2] == ["/from/rank0", config.sys_path[1]] and sys.path.count(config.sys_path[1]) == 1
    expected: list[Any] = [
        ("logs", ("DEBUG", "json", "llm[rank 1]", None)),
        ("watch", tp_follower._exit_with_parent, (config.parent_pid,), True),
        "watching",
        ("join", "llm", 1),
        ("build", "llm", True, "/models/m", "cpu"),
    ]
    if has_runner:
        assert caught.value.args == (0,) and done == [*expected, ("follow", runner, GROUP, 1, "llm")]
    else:  # rank 0 refuses the stage, saying why: nothing to follow
        assert caught.value.args == (2,) and done == expected
