"""Rank 0 of a tensor-parallel stage, in the test process, each test well under a second:
the ranks' environment, the lockstep mirror of the runner's calls over a real gloo group
(of one rank: what rank 0 broadcasts is seen through a spy on the broadcast), how a lost
group fails calls, the watcher of a follower that dies, and ``lead``'s checks of what the
stage's factory built. Groups of real follower processes: tests/models/test_tensor_parallel.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from omnictl.coordinator.launcher import describe_exit
from omnictl.exceptions import GroupLost, StartupError
from omnictl.models.tensor_parallel import RankInfo, current, engine_ranks
from omnictl.stage import tp_group
from omnictl.stage.tp_group import Group, RunnerMirror, _is_transport_error, lead, rank_environment, rank_info, running
from omnictl.topology.model import StageSpec, Topology

CPU = StageSpec(name="llm", factory="f:g", tp_size=2)
GPU = StageSpec(name="llm", factory="f:g", gpu=(3, 5), tp_size=2)


def test_each_rank_environment_names_its_rank_and_device() -> None:
    assert rank_environment(CPU, 1) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": ""}
    assert rank_environment(GPU, 1) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "5"}
    assert rank_environment(GPU, 0)["LOCAL_RANK"] == "3"
    assert (tp_group.backend_for(CPU), tp_group.backend_for(GPU)) == ("gloo", "nccl")
    assert rank_info(GPU, 1) == RankInfo("llm", 1, 2, "cuda:5")
    assert rank_info(CPU, 0) == RankInfo("llm", 0, 2, "cpu")


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (RuntimeError("Connection reset by peer"), True),
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] connection closed by peer"), True),
        (RuntimeError("Gloo all-reduce failed"), True),
        (RuntimeError("NCCL error: unhandled system error"), True),
        (RuntimeError("connection refused"), True),  # each word alone
        (RuntimeError("the gloo pair went away"), True),
        (type("DistBackendError", (RuntimeError,), {})("rank 1 went away"), True),
        (RuntimeError("shape '[2, 3]' is invalid for input of size 5"), False),
        (ValueError("bad token"), False),
    ],
)
def test_a_vanished_peer_is_told_from_a_model_error(exc: BaseException, lost: bool) -> None:
    assert _is_transport_error(exc) is lost


class Runner:
    """A runner whose calls are recorded; ``prefill_chunk`` calls ``prefill`` as real ones do."""

    tensor_parallel_ops = ("custom", "missing")

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: BaseException | None = None

    def prefill(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append(("prefill", args))
        if self.fail is not None:
            raise self.fail
        return f"prefilled {args}"

    def prefill_chunk(self, *args: Any) -> str:
        self.calls.append(("prefill_chunk", args))
        return self.prefill(*args)

    def decode(self, *args: Any) -> str:
        self.calls.append(("decode", args))
        return "decoded"

    def release(self, *args: Any) -> None:
        self.calls.append(("release", args))

    def custom(self, *args: Any) -> str:
        self.calls.append(("custom", args))
        return "custom"

    def not_mirrored(self) -> str:
        return "local"

    def kv_slots(self) -> int:
        return 7


@pytest.fixture()
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A real gloo group of this one process; what rank 0 broadcasts is recorded."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    messages: list[Any] = []
    broadcast = dist.broadcast_object_list

    def spy(objects: list[Any], *, src: int, group: Any) -> None:  # torch's src default is none
        assert src == 0 and group is dist.group.WORLD
        messages.append(objects[0])
        broadcast(objects, src=src, group=group)

    monkeypatch.setattr(dist, "broadcast_object_list", spy)
    try:
        yield messages
    finally:
        dist.destroy_process_group()


def mirror_of(runner: Runner) -> RunnerMirror:
    return RunnerMirror(runner, dist.group.WORLD, "llm")


def lose_soon(mirror: RunnerMirror, cause: str) -> threading.Timer:
    """What the follower's watcher does when its rank dies: name the cause, a moment later."""
    timer = threading.Timer(0.05, setattr, (mirror, "lost", cause))
    timer.start()
    return timer


def test_each_mirrored_call_is_broadcast_first_then_run_here(sent: list[Any]) -> None:
    runner = Runner()
    mirror = mirror_of(runner)
    assert mirror.ops == ("prefill", "prefill_chunk", "decode", "release", "custom")
    assert runner.prefill(1, x=2) == "prefilled (1,)"
    assert runner.prefill_chunk(3) == "prefilled (3,)"  # its nested prefill runs here only
    assert runner.custom() == "custom" and runner.not_mirrored() == "local"
    assert sent == [("prefill", (1,), {"x": 2}, False), ("prefill_chunk", (3,), {}, False), ("custom", (), {}, False)]
    assert runner.calls == [("prefill", (1,)), ("prefill_chunk", (3,)), ("prefill", (3,)), ("custom", ())]


def test_a_failed_call_is_told_to_the_followers_with_the_next_one(sent: list[Any]) -> None:
    runner = Runner()
    mirror_of(runner)
    runner.fail = ValueError("bad input")
    with pytest.raises(ValueError, match="bad input"):
        runner.prefill("a")
    runner.fail = None
    runner.decode()
    runner.decode()
    assert [message[3] for message in sent] == [False, True, False]


def test_a_lost_group_fails_every_call_but_release(sent: list[Any]) -> None:
    runner = Runner()
    mirror = mirror_of(runner)
    mirror.lost = "stage 'llm': tensor-parallel rank 1 (pid 9) died (killed by SIGKILL)"
    with pytest.raises(GroupLost, match=r"^stage 'llm': tensor-parallel rank 1 \(pid 9\) died"):
        runner.decode()
    runner.release("r1")  # forgetting a request needs no other rank
    assert runner.calls == [("release", ("r1",))] and sent == []


def test_a_transport_error_inside_a_call_fails_it_naming_the_dead_rank(sent: list[Any]) -> None:
    runner = Runner()
    mirror = mirror_of(runner)
    runner.fail = RuntimeError("Connection closed by peer")
    timer = lose_soon(mirror, "stage 'llm': tensor-parallel rank 1 died")
    with pytest.raises(GroupLost, match="^stage 'llm': tensor-parallel rank 1 died$") as caught:
        runner.prefill("a")
    timer.join()
    assert isinstance(caught.value.__cause__, RuntimeError)
    runner.fail = GroupLost("lost inside")  # a GroupLost from below passes as it is
    with pytest.raises(GroupLost, match="^stage 'llm': tensor-parallel rank 1 died$"):
        runner.prefill("b")  # the group is lost by now: refused before it runs
    assert runner.calls == [("prefill", ("a",))]


def test_a_group_lost_below_a_call_passes_through_unchanged(sent: list[Any]) -> None:
    runner = Runner()
    mirror_of(runner)
    runner.fail = GroupLost("from the model's own collective")
    with pytest.raises(GroupLost, match="^from the model's own collective$"):
        runner.prefill("a")


def test_a_broadcast_that_fails_names_the_dead_rank(sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner()
    mirror = mirror_of(runner)

    def closed(objects: list[Any], src: int = 0, group: Any = None) -> None:
        raise RuntimeError("[gloo] peer closed")

    monkeypatch.setattr(dist, "broadcast_object_list", closed)
    timer = lose_soon(mirror, "stage 'llm': rank 1 died")
    with pytest.raises(GroupLost, match="^stage 'llm': rank 1 died$"):
        runner.decode()
    timer.join()
    assert runner.calls == []  # not run here either: the ranks would part ways


def test_follower_kv_slots_and_shut_down(sent: list[Any]) -> None:
    runner = Runner()
    mirror = mirror_of(runner)
    assert mirror.follower_kv_slots() == []  # a group of one: no follower
    assert sent == [("kv_slots", (), {}, False)]
    with mirror._lock:  # a step running: the count is not waited for
        assert mirror.follower_kv_slots(timeout=0.01) is None
    mirror.shut_down()
    assert mirror.lost == "stage 'llm': the group was shut down" and sent[-1] is None
    mirror.shut_down()  # once
    assert mirror.follower_kv_slots() is None and len(sent) == 2


def test_a_shut_down_whose_broadcast_fails_is_quiet(sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = mirror_of(Runner())
    monkeypatch.setattr(RunnerMirror, "_wait_for_cause", lambda self: "gone")

    def closed(objects: list[Any], src: int = 0, group: Any = None) -> None:
        raise RuntimeError("[gloo] peer closed")

    monkeypatch.setattr(dist, "broadcast_object_list", closed)
    mirror.shut_down()
    assert mirror.lost == "stage 'llm': the group was shut down"


def test_without_a_cause_the_stage_says_a_rank_stopped_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = RunnerMirror(Runner(), None, "llm")
    clock = iter([0.0, 0.5, 1.0, 2.5])
    monkeypatch.setattr(tp_group.time, "monotonic", lambda: next(clock))
    slept: list[float] = []
    monkeypatch.setattr(tp_group.time, "sleep", slept.append)
    assert mirror._wait_for_cause() == "stage 'llm': a tensor-parallel rank stopped answering"
    assert slept == [0.01, 0.01]  # polled at 0.5 and 1.0 s; 2.5 s is past the 2 s wait
    clock = iter([0.0, 2.0])
    slept.clear()
    assert mirror._wait_for_cause().endswith("stopped answering") and slept == []  # 2 s is the deadline itself


# --- the group's handle on its followers -------------------------------------------------


def exited(code: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-S", "-c", f"raise SystemExit({code})"])
    process.wait()
    return process


class Exits(Exception):
    pass


def test_a_follower_that_dies_while_serving_ends_the_stage_process(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    done: list[tuple[str, Any]] = []
    monkeypatch.setattr(tp_group.time, "sleep", lambda seconds: done.append(("sleep", seconds)))
    monkeypatch.setattr(tp_group.os, "kill", lambda pid, sig: done.append(("kill", (pid, sig))))
    group = Group(CPU, Topology.__new__(Topology), None)
    group.mirror = RunnerMirror(Runner(), None, "llm")
    group.ready = True
    process = exited(3)
    group._watch(1, process)
    cause = f"stage 'llm': tensor-parallel rank 1 (pid {process.pid}) died ({describe_exit(3)})"
    assert group.mirror.lost == cause
    assert done == [("sleep", 1.0), ("kill", (tp_group.os.getpid(), tp_group.signal.SIGTERM))]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"{cause}; the group cannot serve short a rank: stage process {tp_group.os.getpid()} exits to restart it"]


def test_a_follower_that_dies_while_the_group_starts_ends_it_unless_rank_0_got_there(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    group = Group(CPU, Topology.__new__(Topology), None)
    assert group.ready is False and group.stopping is False and group.mirror is None
    done: list[Any] = []

    def sleep(seconds: float) -> None:
        done.append(("sleep", seconds))

    def exit_now(code: int) -> None:
        done.append(("exit", code))
        raise Exits

    monkeypatch.setattr(tp_group.time, "sleep", sleep)
    monkeypatch.setattr(tp_group.os, "_exit", exit_now)
    process = exited(2)
    with pytest.raises(Exits):
        group._watch(1, process)
    assert done == [("sleep", 5.0), ("exit", 1)]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"stage 'llm': tensor-parallel rank 1 (pid {process.pid}) died ({describe_exit(2)}) while the group was starting"]
    done.clear()
    monkeypatch.setattr(tp_group.time, "sleep", lambda seconds: setattr(group, "ready", True))
    group._watch(1, exited(2))  # rank 0 came up meanwhile (and will fail on its own)
    assert done == []


def test_a_follower_that_ends_on_purpose_or_after_another_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp_group.time, "sleep", lambda seconds: pytest.fail("waited"))
    group = Group(CPU, Topology.__new__(Topology), None)
    group.stopping = True
    group._watch(1, exited(0))
    group.stopping = False
    group.mirror = RunnerMirror(Runner(), None, "llm")
    group.mirror.lost = "rank 2 first"
    group._watch(1, exited(0))
    assert group.mirror.lost == "rank 2 first"


def test_stop_waits_for_the_followers_and_kills_one_that_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    group = Group(CPU, Topology.__new__(Topology), None)
    assert group.follower_kv_slots() is None  # not started
    group.followers = {1: exited(0)}
    stays = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"])
    group.followers[2] = stays
    waited: list[float | None] = []
    wait = subprocess.Popen.wait

    def short_wait(self: subprocess.Popen[bytes], timeout: float | None = None) -> int:
        waited.append(timeout)
        return wait(self, timeout=0.05 if timeout == 5 else timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", short_wait)
    group.stop()
    assert group.stopping and waited[:2] == [5, 5]
    assert stays.wait() == -9


# --- lead: what the factory built ------------------------------------------------------------


class Built:
    def __init__(self, runner: Any = None) -> None:
        self.runner = runner


@pytest.fixture()
def groups(monkeypatch: pytest.MonkeyPatch) -> dict[str, Group]:
    monkeypatch.setattr(tp_group, "_groups", {})
    return tp_group._groups


def test_lead_of_an_engine_that_runs_its_own_ranks_returns_its_scheduler(groups: dict[str, Group]) -> None:
    built = Built()

    def build() -> Built:
        assert current() == RankInfo("llm", 0, 2, "cpu", join=current().join)  # type: ignore[union-attr]
        assert engine_ranks() == 2
        return built

    assert lead(CPU, Topology.__new__(Topology), None, build) is built
    assert running("llm") is None and current() is None


def test_lead_refuses_a_factory_that_did_not_shard_its_model(groups: dict[str, Group]) -> None:
    hint = ("load the model with HFCausalLMRunner.from_pretrained (or pass "
            "omnictl.models.tensor_parallel.load_kwargs(config) to from_pretrained), "
            "hand engine_ranks() to an engine, or drop `tp_size`")
    with pytest.raises(StartupError) as whole:
        lead(CPU, Topology.__new__(Topology), None, lambda: Built(Runner()))
    assert str(whole.value) == (
        f"stage 'llm': tp_size 2, but its factory loaded its model whole (it would run on one rank) ({hint})")
    with pytest.raises(StartupError) as bare:
        lead(CPU, Topology.__new__(Topology), None, lambda: Built())
    assert str(bare.value) == (
        f"stage 'llm': tp_size 2, but its factory built a scheduler without a model runner (it would run on one rank) "
        f"({hint})")
    with pytest.raises(StartupError, match="built a scheduler without a model runner"):
        lead(CPU, Topology.__new__(Topology), None, lambda: object())  # no `runner` at all
    with pytest.raises(KeyError):
        lead(CPU, Topology.__new__(Topology), None, lambda: {}["no model"])
    assert groups == {}


def test_lead_mirrors_the_runner_of_a_sharded_model(groups: dict[str, Group], sent: list[Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Group] = []

    def start(self: Group) -> Any:
        started.append(self)
        return dist.group.WORLD  # the followers' start is the real-process test's

    monkeypatch.setattr(Group, "start", start)
    runner = Runner()

    def build() -> Built:
        info = current()
        assert info is not None
        info.join_group()
        info.join_group()  # once
        return Built(runner)

    topology = Topology.__new__(Topology)
    built = lead(CPU, topology, "/models/m", build)
    group = running("llm")
    assert group is not None and started == [group] and group.ready
    assert group.spec is CPU and group.topology is topology and group.model_path == "/models/m"
    assert group.mirror is not None and group.mirror.runner is runner and group.mirror.stage == "llm"
    built.runner.decode(1)
    assert sent == [("decode", (1,), {}, False)]
    assert group.follower_kv_slots() == []


# --- start: the followers' processes ---------------------------------------------------------


class Follower:
    """Stands in for a follower's ``subprocess.Popen``: keeps its command, environment and the
    configuration written to its stdin; its ``wait`` (the watcher's) returns once released."""

    started: list[Follower] = []

    def __init__(self, argv: list[str], stdin: Any, env: dict[str, str]) -> None:
        import io

        self.argv, self.env, self.pid = argv, env, 4000 + len(Follower.started)
        self.stdin = io.BytesIO()
        self.stdin.close = lambda: setattr(self, "written", self.stdin.getvalue())  # type: ignore[method-assign]
        self.released = threading.Event()
        Follower.started.append(self)

    def wait(self, timeout: float | None = None) -> int:
        self.released.wait(5)
        return 0


def test_start_launches_each_follower_with_its_rank_and_the_store_then_joins_as_rank_0(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import os
    import pickle

    from omnictl import logs

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)  # start sets rank 0's: put back after the test
    monkeypatch.setattr(Follower, "started", [])
    monkeypatch.setattr(tp_group.subprocess, "Popen", Follower)
    joined: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tp_group, "join", lambda store, spec, rank: joined.append((store.port, spec, rank)) or "ops")
    from omnictl.topology import loads

    topology = loads("stages:\n  - {name: llm, factory: tests.stage.build_factories.double, terminal: true}\n")
    spec = StageSpec(name="llm", factory="f:g", tp_size=3)
    group = Group(spec, topology, "/models/m")
    with caplog.at_level("INFO", logger=tp_group.log.name):
        assert group.start() == "ops"
    try:
        [(port, joined_spec, rank)] = joined
        assert joined_spec is spec and rank == 0 and port > 0
        assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} == {"RANK": "0", "WORLD_SIZE": "3",
                                                                                 "LOCAL_RANK": "0"}
        assert sorted(group.followers) == [1, 2] and [f.pid for f in group.followers.values()] == [4000, 4001]
        settings = logs.settings()
        for rank, follower in group.followers.items():
            assert isinstance(follower, Follower)
            assert follower.argv == [sys.executable, "-m", "omnictl.stage.tp_follower"]
            assert {k: follower.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")} == \
                rank_environment(spec, rank)
            config = pickle.loads(follower.written)
            assert (config.stage, config.topology, config.model_path, config.rank, config.size) == \
                ("llm", topology, "/models/m", rank, 3)
            assert (config.store_port, config.backend, config.parent_pid) == (port, "gloo", os.getpid())
            assert config.sys_path == sys.path and (config.log_level, config.log_format) == (settings.level,
                                                                                             settings.format)
        watchers = sorted(t.name for t in threading.enumerate() if t.name.startswith("tp-rank-"))
        assert watchers == ["tp-rank-1", "tp-rank-2"]
        [line] = [r.getMessage() for r in caplog.records if "tensor-parallel group" in r.getMessage()]
        assert line == "stage 'llm': tensor-parallel group of 3 ranks (gloo), followers pid 4000, 4001"
    finally:
        group.stopping = True  # the watchers then return quietly
        for follower in Follower.started:
            follower.released.set()


def test_follower_kv_slots_gathers_each_follower_s_count_over_the_ops_group(sent: list[Any],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    group = object()  # the ops group of three ranks
    mirror = RunnerMirror(Runner(), group, "llm")
    gathered: list[Any] = []
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, *, src, group: None)
    monkeypatch.setattr(dist, "get_world_size", lambda ops: 3 if ops is group else pytest.fail("another group"))

    def gather_object(obj: Any, counts: list[Any], *, dst: int, group: Any) -> None:
        gathered.append((obj, dst, group))
        counts[:] = [obj, 5.0, 6]  # each rank's, rank 0's own first

    monkeypatch.setattr(dist, "gather_object", gather_object)
    assert mirror.follower_kv_slots() == [5, 6]
    assert gathered == [(7, 0, group)] and type(gathered[0][0]) is int
    group_handle = Group(CPU, Topology.__new__(Topology), None)
    group_handle.mirror = mirror
    waited: list[float] = []
    monkeypatch.setattr(mirror, "follower_kv_slots", lambda timeout: waited.append(timeout) or [1])
    assert group_handle.follower_kv_slots() == [1] and waited == [0.2]  # a stats reply waits little


def test_mirrored_calls_keep_their_keyword_arguments_nested_and_after_the_group_is_lost(sent: list[Any]) -> None:
    class Keywords(Runner):
        def prefill_chunk(self, *args: Any, **kwargs: Any) -> str:
            self.calls.append(("prefill_chunk", (*args, kwargs)))
            return self.prefill(*args, **kwargs)

        def prefill(self, *args: Any, **kwargs: Any) -> str:
            self.calls.append(("prefill", (*args, kwargs)))
            return "prefilled"

        def release(self, *args: Any, **kwargs: Any) -> None:
            self.calls.append(("release", (*args, kwargs)))

    runner = Keywords()
    mirror = mirror_of(runner)
    runner.prefill_chunk("a", size=4)  # its nested prefill runs here, with the keywords too
    mirror.lost = "gone"
    runner.release("a", why="done")
    assert runner.calls == [("prefill_chunk", ("a", {"size": 4})), ("prefill", ("a", {"size": 4})),
                            ("release", ("a", {"why": "done"}))]
    assert sent == [("prefill_chunk", ("a",), {"size": 4}, False)]


def test_a_runner_without_ops_of_its_own_mirrors_the_standard_ones_it_has() -> None:
    class Plain:
        def decode(self) -> str:
            return "decoded"

        def release(self, request_id: str) -> None:
            pass

    assert RunnerMirror(Plain(), None, "llm").ops == ("decode", "release")
