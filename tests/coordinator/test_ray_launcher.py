"""The Ray launcher's own logic in the test process, without a cluster: what it asks Ray for
(the actor's resources and placement, the worker's configuration as typed bytes), how it
reads an actor's end, and what retire and stop take down. Ray's calls (``ray.init``,
``ray.kill``, the actor class) are stand-ins recording what they were given; the real
cluster runs in ``tests/ray/``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from omnictl import logs
from omnictl.coordinator.ray_launcher import RayHandle, RayLauncher, StageActor
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import LaunchError
from omnictl.launch_config import LaunchConfig
from omnictl.stage.startup import WorkerConfig, decode_config
from omnictl.topology import load, loads
from omnictl.topology.model import Topology
from omnictl.transports.curve import CurveKeys

TOPOLOGY = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: far, terminal: true, gpu: [0, 1]}
processes:
  far: {node: gpu-box, cpus: 2.5, replicas: 2}
"""
HOME = "ab" * 28  # a Ray node id (28 bytes, hex): the coordinator's node


@dataclass
class Method:
    """One actor method's ``.remote``: records its arguments; ``run`` answers a future the
    test settles (what awaiting a Ray object ref does)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    future: asyncio.Future[None] | None = None

    def remote(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.future


@dataclass
class Actor:
    options: dict[str, Any]
    run: Method = field(default_factory=Method)
    stop: Method = field(default_factory=Method)


class ActorClass:
    """What ``ray.remote(StageActor)`` returns: ``.options(**o).remote()`` makes an actor."""

    def __init__(self) -> None:
        self.actors: list[Actor] = []
        self._options: dict[str, Any] = {}

    def options(self, **options: Any) -> ActorClass:
        self._options = options
        return self

    def remote(self) -> Actor:
        actor = Actor(self._options, run=Method(future=asyncio.get_running_loop().create_future()))
        self.actors.append(actor)
        return actor


class Context:
    """What ``ray.get_runtime_context()`` answers: the node this process runs on."""

    def get_node_id(self) -> str:
        return HOME


def join_cluster(monkeypatch: pytest.MonkeyPatch, inits: list[str | None], remote: Any,
                 initialized: bool | None = None) -> None:
    """Ray's connection calls as stand-ins: ``inits`` records each ``ray.init(address)``;
    ``initialized`` None: connected once ``init`` was called. One alive node, labelled gpu-box."""
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(inits) if initialized is None else initialized)
    monkeypatch.setattr(ray, "init", lambda address: inits.append(address))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setattr(ray, "remote", lambda cls: remote(cls))
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Labels": {"omnictl-node": "gpu-box"}}])


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Actor, bool]]:
    calls: list[tuple[Actor, bool]] = []
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart: calls.append((actor, no_restart)))
    return calls


def wiring(data_host: str | None = None, tcp: tuple[str, str] = ("tcp://10.0.0.1:5000", "tcp://10.0.0.1:5001"),
           profile: str | None = "tcp://10.0.0.1:5002") -> Wiring:
    """What the coordinator resolved and bound before it built the launcher."""
    return Wiring(Path("/unused"), data_host_given=data_host, curve=CurveKeys.generate(), tcp_coordinator=tcp,
                  profile_tcp_address=profile)


def make(exits: list[tuple[str, str]] | None = None, topology: Topology | None = None, data_host: str | None = None,
         **options: Any) -> tuple[RayLauncher, ActorClass]:
    """A launcher that has 'connected': its home node and actor class set, as ``_connect`` does."""
    seen = exits if exits is not None else []
    launcher = RayLauncher(topology or loads(TOPOLOGY), LaunchConfig.of(model_path="/weights", launcher="ray", **options),
                           wiring(data_host), lambda name, why: seen.append((name, why)))
    actors = ActorClass()
    launcher._connected = True
    launcher._home = HOME
    launcher._actor_class = actors
    return launcher, actors


def cancel_watchers(launcher: RayLauncher) -> None:
    """End a test whose actors never end: every watcher the launcher started is cancelled."""
    for handle in launcher.started:
        assert handle.watcher is not None
        handle.watcher.cancel()


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_labelled_replica_asks_for_its_label_its_cpus_and_gpus_and_gets_its_whole_config() -> None:
    async def main() -> None:
        launcher, actors = make(data_host="10.0.0.7", audio_policy="deadline")
        launcher.tcp_ports["far#1"] = 6123  # the port it had before: a relaunch keeps its address
        handle = launcher.start("far#1")
        actor = actors.actors[0]
        assert actor.options == {"num_cpus": 2.5, "num_gpus": 2, "name": None, "max_concurrency": 4,
                                 "label_selector": {"omnictl-node": "gpu-box"}}
        assert handle.name == "far#1" and handle.actor is actor and handle.node == "gpu-box" and handle.restarts == 0
        assert launcher.handles == {"far#1": handle} and launcher.started == [handle]
        (raw,), = actor.run.calls
        assert isinstance(raw, bytes)  # typed msgpack, never a pickled object
        config = decode_config(raw)
        assert isinstance(config, WorkerConfig)
        assert (config.process, config.instance, config.model_path) == ("far", "far#1", "/weights")
        assert config.topology.processes["far"].instances == ("far#0", "far#1")
        assert config.process_addresses == {}
        assert (config.coordinator_address, config.broadcast_address) == ("tcp://10.0.0.1:5000", "tcp://10.0.0.1:5001")
        assert config.profile_address == "tcp://10.0.0.1:5002"
        assert config.parent_pid == 0  # no parent to watch on another node
        assert (config.node, config.data_host, config.tcp_port) == ("gpu-box", "10.0.0.7", 6123)
        assert config.curve is not None and config.curve.client_secret == launcher.curve.client_secret
        assert config.audio_policy == "deadline"
        assert (config.log_level, config.log_format) == (logs.settings().level, logs.settings().format)
        assert handle.watcher is not None and not handle.watcher.done()
        cancel_watchers(launcher)

    asyncio.run(main())


def test_a_replica_imports_from_beside_its_topology_file_and_logs_as_the_server_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipeline.yaml").write_text(TOPOLOGY)
    monkeypatch.setattr(logs, "settings", lambda: logs.LogSettings("DEBUG", "json"))

    async def main() -> None:
        launcher, actors = make(topology=load(tmp_path / "pipeline.yaml"))
        assert launcher._topology_dir == tmp_path.resolve()
        launcher.start("a")
        config = decode_config(actors.actors[0].run.calls[0][0])
        assert config.sys_path[0] == str(tmp_path.resolve())  # user code beside the topology first
        assert (config.log_level, config.log_format) == ("DEBUG", "json")
        cancel_watchers(launcher)

    asyncio.run(main())


def test_an_unlabelled_replica_is_pinned_to_the_coordinators_node_with_one_cpu_and_no_gpu() -> None:
    async def main() -> None:
        launcher, actors = make()
        launcher.start("a")
        options = actors.actors[0].options
        assert "label_selector" not in options
        strategy = options.pop("scheduling_strategy")
        assert isinstance(strategy, NodeAffinitySchedulingStrategy)
        assert (strategy.node_id, strategy.soft) == (HOME, False)
        assert options == {"num_cpus": 1.0, "num_gpus": 0, "name": None, "max_concurrency": 4}
        config = decode_config(actors.actors[0].run.calls[0][0])
        assert (config.process, config.instance, config.node, config.tcp_port) == ("a", "a", None, 0)
        assert config.audio_policy == "fifo"
        cancel_watchers(launcher)

    asyncio.run(main())


def test_a_relaunch_counts_its_restarts_and_keeps_its_predecessor_for_stop() -> None:
    async def main() -> None:
        launcher, actors = make()
        first = launcher.start("far#0")
        second = launcher.start("far#0")
        third = launcher.start("far#0")
        other = launcher.start("far#1")
        assert [first.restarts, second.restarts, third.restarts, other.restarts] == [0, 1, 2, 0]
        assert launcher.handles == {"far#0": third, "far#1": other}
        assert launcher.started == [first, second, third, other]
        cancel_watchers(launcher)

    asyncio.run(main())


def test_an_actor_that_ends_is_reported_once_with_why() -> None:
    async def main() -> None:
        exits: list[tuple[str, str]] = []
        launcher, actors = make(exits)
        stopped, died, silent = launcher.start("a"), launcher.start("far#0"), launcher.start("far#1")
        run = [actor.run.future for actor in actors.actors]
        assert all(f is not None for f in run)
        run[0].set_result(None)  # type: ignore[union-attr]
        run[1].set_exception(RayActorError())  # type: ignore[union-attr]
        run[2].set_exception(RayError(""))  # type: ignore[union-attr]
        await settle()
        assert stopped.exit_reason == "its worker stopped" and not stopped.alive()
        assert died.exit_reason == ("its Ray actor died (RayActorError: The actor experienced an error "
                                    "before finishing this task.)")
        assert silent.exit_reason == "its Ray actor died (RayError: RayError)"  # no message: its type
        assert died.describe_exit() == died.exit_reason
        assert exits == [("a", "its worker stopped"), ("far#0", died.exit_reason), ("far#1", silent.exit_reason)]

    asyncio.run(main())


def test_a_multi_line_ray_error_is_reported_by_its_first_line() -> None:
    async def main() -> None:
        launcher, actors = make()
        handle = launcher.start("a")
        actors.actors[0].run.future.set_exception(RayError("  node 3 died\n  traceback ...\n"))  # type: ignore[union-attr]
        await settle()
        assert handle.exit_reason == "its Ray actor died (RayError: node 3 died)"

    asyncio.run(main())


def test_an_end_is_not_reported_for_a_replaced_actor_or_while_stopping() -> None:
    async def main() -> None:
        exits: list[tuple[str, str]] = []
        launcher, actors = make(exits)
        old = launcher.start("a")
        launcher.start("a")  # relaunched: the old actor's end is not this replica's death
        actors.actors[0].run.future.set_result(None)  # type: ignore[union-attr]
        await settle()
        assert old.exit_reason == "its worker stopped" and exits == []
        launcher._stopping = True
        actors.actors[1].run.future.set_exception(RayActorError())  # type: ignore[union-attr]
        await settle()
        assert exits == []
        assert launcher.handles["a"].exit_reason is not None  # noted, not reported

    asyncio.run(main())


def test_retire_asks_the_worker_to_stop_then_kills_the_actor_without_reporting_a_death(
        killed: list[tuple[Actor, bool]]) -> None:
    async def main() -> None:
        exits: list[tuple[str, str]] = []
        launcher, actors = make(exits)
        handle = launcher.start("far#1")
        actor = actors.actors[0]

        async def worker_stops() -> None:  # the stop request reaches the worker, which returns
            while not actor.stop.calls:
                await asyncio.sleep(0.001)
            actor.run.future.set_result(None)  # type: ignore[union-attr]

        stopping = asyncio.create_task(worker_stops())
        await launcher.retire("far#1", timeout=2.0)
        await stopping
        assert actor.stop.calls == [()]
        assert killed == [(actor, True)]
        assert "far#1" not in launcher.handles
        assert handle.exit_reason == "its worker stopped"
        assert exits == []  # forgotten before it stopped: a retirement, not a death

    asyncio.run(main())


def test_retire_of_a_dead_actor_or_a_hung_worker_still_kills_it_within_the_timeout(
        killed: list[tuple[Actor, bool]]) -> None:
    async def main() -> None:
        launcher, actors = make()
        dead = launcher.start("a")
        dead.exit_reason = "its Ray actor died (RayActorError: gone)"
        await launcher.retire("a", timeout=0.05)
        assert actors.actors[0].stop.calls == []  # nothing to ask
        hung = launcher.start("far#0")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await launcher.retire("far#0", timeout=0.05)  # its worker never returns
        assert loop.time() - started < 1.0
        assert actors.actors[1].stop.calls == [()]
        assert hung.watcher is not None
        await asyncio.sleep(0)
        assert hung.watcher.cancelled()
        assert killed == [(actors.actors[0], True), (actors.actors[1], True)]

    asyncio.run(main())


def test_stop_kills_every_actor_it_started_predecessors_included_and_leaves_ray_it_did_not_start(
        killed: list[tuple[Actor, bool]], monkeypatch: pytest.MonkeyPatch) -> None:
    shutdowns: list[bool] = []
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(True))

    async def main() -> None:
        exits: list[tuple[str, str]] = []
        launcher, actors = make(exits)
        first = launcher.start("a")
        launcher.start("a")  # its successor
        launcher.start("far#0")
        actors.actors[0].run.future.set_result(None)  # type: ignore[union-attr]
        await settle()
        assert first.exit_reason == "its worker stopped"

        async def workers_stop() -> None:  # each asked worker returns, as a real one does
            while not all(a.stop.calls for a in actors.actors[1:]):
                await asyncio.sleep(0.001)
            for actor in actors.actors[1:]:
                actor.run.future.set_result(None)  # type: ignore[union-attr]

        stopping = asyncio.create_task(workers_stop())
        await launcher.stop(timeout=1.0)
        await stopping
        assert [a.stop.calls for a in actors.actors] == [[], [()], [()]]  # the alive ones asked
        assert killed == [(a, True) for a in actors.actors]
        assert exits == []  # stopping: no end is a death
        assert shutdowns == []  # the cluster connection was there before this launch
        assert all(h.watcher is not None and h.watcher.done() for h in launcher.started)

        owner, _ = make()
        owner._owns_ray = True
        await owner.stop(timeout=0.1)
        assert shutdowns == [True]

    asyncio.run(main())


def test_stop_does_not_wait_past_its_timeout_for_a_hung_worker(killed: list[tuple[Actor, bool]]) -> None:
    async def main() -> None:
        launcher, actors = make()
        hung = launcher.start("a")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await launcher.stop(timeout=0.05)  # its worker never returns
        assert loop.time() - started < 1.0
        await asyncio.sleep(0)
        assert hung.watcher is not None and hung.watcher.cancelled()
        assert killed == [(actors.actors[0], True)] and actors.actors[0].stop.calls == [()]

    asyncio.run(main())


def test_stop_before_any_start_touches_nothing(killed: list[tuple[Actor, bool]], monkeypatch: pytest.MonkeyPatch) -> None:
    shutdowns: list[bool] = []
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(True))

    async def main() -> None:
        launcher, _ = make()
        launcher._connected = False
        launcher._owns_ray = True
        await launcher.stop()
        assert launcher._stopping
        assert killed == [] and shutdowns == []

    asyncio.run(main())


@pytest.mark.parametrize("initialized", [False, True])
def test_connect_joins_the_cluster_once_checks_the_labels_and_pins_to_its_own_node(
        monkeypatch: pytest.MonkeyPatch, initialized: bool) -> None:
    inits: list[str | None] = []
    join_cluster(monkeypatch, inits, lambda cls: ("remote", cls), initialized)
    launcher = RayLauncher(loads(TOPOLOGY), LaunchConfig.of(launcher="ray", ray_address="ray://head:10001"),
                           wiring(tcp=("tcp://h:1", "tcp://h:2"), profile=None), lambda name, why: None)
    launcher._connect()
    assert inits == ([] if initialized else ["ray://head:10001"])
    assert launcher._owns_ray is (not initialized)
    assert launcher._connected and launcher._home == HOME
    assert launcher._actor_class == ("remote", StageActor)

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": False, "Labels": {"omnictl-node": "gpu-box"}}])
    with pytest.raises(LaunchError, match=r"process 'far' asks for node 'gpu-box'"):
        launcher._connect()


def test_the_first_start_joins_the_cluster_then_starts_the_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    actors = ActorClass()
    inits: list[str | None] = []
    join_cluster(monkeypatch, inits, lambda cls: actors)

    async def main() -> None:
        launcher = RayLauncher(loads(TOPOLOGY), LaunchConfig.of(launcher="ray"),
                               wiring(tcp=("tcp://h:1", "tcp://h:2"), profile=None), lambda name, why: None)
        assert not launcher._connected
        launcher.start("a")
        launcher.start("far#0")
        assert inits == [None] and launcher._owns_ray  # joined once, on the first start
        assert [a.options.get("label_selector") for a in actors.actors] == [None, {"omnictl-node": "gpu-box"}]
        cancel_watchers(launcher)

    asyncio.run(main())


def test_a_launcher_knows_each_replicas_process_and_node_from_the_topology() -> None:
    launcher, _ = make()
    assert launcher.process_of == {"a": "a", "far#0": "far", "far#1": "far"}
    assert launcher.node_of == {"a": None, "far#0": "gpu-box", "far#1": "gpu-box"}
    assert (launcher.handles, launcher.started, launcher.tcp_ports) == ({}, [], {})
    assert not launcher._stopping and not launcher._owns_ray and launcher.audio_policy == "fifo"
    assert launcher.ray_address is None and launcher.data_host is None


def test_a_handle_takes_the_first_ready_report_only() -> None:
    async def main() -> None:
        handle = RayHandle("far#0", actor=None, node="gpu-box")
        assert handle.alive() and handle.describe_exit() == "still running" and handle.pid == 0
        assert not handle.ready.done()
        handle.reported_ready(4242)
        handle.reported_ready(9999)  # a late duplicate changes nothing
        assert handle.ready.done() and handle.pid == 4242
        handle.exit_reason = "its worker stopped"
        assert not handle.alive() and handle.describe_exit() == "its worker stopped"

    asyncio.run(main())


def test_a_stage_actor_stops_its_worker_and_without_one_does_nothing() -> None:
    class Worker:
        stops = 0

        def stop(self) -> None:
            Worker.stops += 1

    async def main() -> None:
        actor = StageActor()
        await actor.stop()  # not running yet: nothing to stop
        actor.worker = Worker()
        await actor.stop()
        assert Worker.stops == 1

    asyncio.run(main())



def test_a_handle_kills_its_actor_for_good_and_an_actor_tells_its_node(killed: list[tuple[Actor, bool]],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())

    async def main() -> None:
        actor = Actor({})
        RayHandle("far#0", actor=actor, node="gpu-box").kill()
        assert killed == [(actor, True)]  # no_restart: Ray must not bring it back behind omnictl's back
        assert StageActor().node_id() == HOME

    asyncio.run(main())
