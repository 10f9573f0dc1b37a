"""The launchers: exit descriptions, thread budgets and labels alone, and the local launcher over
real (no-op) stage processes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from omnictl.coordinator.launcher import Launcher, describe_exit
from omnictl.coordinator.ray_launcher import check_labels, cluster_labels
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import LaunchError
from omnictl.launch_config import LaunchConfig
from omnictl.topology import loads

THREE = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, next: [c]}
  - {name: c, factory: m.c, process: rep, terminal: true}
processes:
  rep: {replicas: 2}
"""

LABELLED = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: far, terminal: true}
processes:
  far: {node: gpu-box}
"""


def launcher(topology: str = THREE) -> Launcher:
    wiring = Wiring(Path("/x"), control_address="ipc:///x/control", broadcast_address="ipc:///x/broadcast")
    return Launcher(loads(topology), LaunchConfig.of(model_path="/weights"), wiring, lambda name, why: None)


@pytest.mark.parametrize(("code", "text"), [(None, "still running"), (0, "exit code 0"), (3, "exit code 3"),
                                            (-signal.SIGKILL, "killed by SIGKILL"), (-200, "killed by signal 200")])
def test_an_exit_is_described_as_an_operator_reads_it(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_the_cores_are_split_between_the_stage_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    env = launcher()._environment()
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cores over a, b, rep#0, rep#1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert launcher()._environment()["OMP_NUM_THREADS"] == "1"  # never 0


def test_a_thread_count_the_user_set_is_kept_and_progress_bars_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    env = launcher()._environment()
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["PYTHONWARNINGS"] == "error::DeprecationWarning,ignore::UserWarning:multiprocessing.resource_tracker"
    monkeypatch.delenv("PYTHONWARNINGS")
    assert launcher()._environment()["PYTHONWARNINGS"] == "ignore::UserWarning:multiprocessing.resource_tracker"


def test_the_launcher_knows_every_replica_its_process_and_node() -> None:
    local = launcher()
    assert local.process_of == {"a": "a", "b": "b", "rep#0": "rep", "rep#1": "rep"}
    assert local.node_of == {"a": None, "b": None, "rep#0": None, "rep#1": None}
    assert local.configs.model_path == "/weights" and local.handles == {}
    assert launcher(LABELLED).node_of == {"a": None, "far": "gpu-box"}


def test_a_labelled_process_without_a_tcp_coordinator_is_refused_naming_it() -> None:
    async def go() -> None:
        with pytest.raises(LaunchError, match="process 'far' is on node 'gpu-box' but the coordinator takes no tcp"):
            launcher(LABELLED).start("far")

    asyncio.run(go())


def test_only_alive_nodes_labels_count() -> None:
    nodes = [
        {"Alive": True, "Labels": {"omnictl-node": "gpu-box"}},
        {"Alive": True, "Labels": {"omnictl-node": "cpu-box"}},
        {"Alive": False, "Labels": {"omnictl-node": "dead-box"}},
        {"Alive": True, "Labels": {}},
        {"Alive": True},
        {"Alive": True, "Labels": {"omnictl-node": "gpu-box"}},
    ]
    assert cluster_labels(nodes) == ["cpu-box", "gpu-box"]


def test_a_label_no_node_carries_fails_the_launch_naming_process_label_and_what_there_is() -> None:
    topology = loads(LABELLED)
    check_labels(topology, ["gpu-box", "other"])  # carried: fine
    with pytest.raises(LaunchError, match=r"process 'far' asks for node 'gpu-box', which no alive Ray node carries "
                                          r"\(labels in the cluster: cpu-box\); start one with `ray start --address "
                                          r"\.\.\. --labels '\{\"omnictl-node\": \"gpu-box\"\}'`") as error:
        check_labels(topology, ["cpu-box"])
    assert error.value.stage == "b"
    with pytest.raises(LaunchError, match=r"labels in the cluster: none"):
        check_labels(topology, [])
    with pytest.raises(LaunchError, match=r"\(labels in the cluster: a-box, cpu-box\)"):
        check_labels(topology, ["a-box", "cpu-box"])


def test_the_local_launcher_starts_watches_restarts_and_stops_real_processes(tmp_path: Path) -> None:
    # One real stage process per replica (a no-op stage: no model, no torch), the real
    # coordinator: start, serve, a SIGKILL reported by the pidfd watch, the restart, the stop.
    from omnictl.coordinator.coordinator import Coordinator
    from omnictl.topology import load
    from tests.support import topo

    path = topo.write(tmp_path / "t.yaml", [
        {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"]},
        {"name": "b", "factory": "omnictl.models.examples.identity", "terminal": True, "process": "rep"},
    ], processes={"rep": {"replicas": 2}})

    async def main() -> None:
        exits: list[tuple[str, str]] = []
        c = Coordinator(load(path), LaunchConfig.of(ready_timeout=60.0, max_restarts=1, run_dir=tmp_path / "run"))
        launcher = c.launcher
        assert isinstance(launcher, Launcher)
        watched = c.on_process_exit

        def on_exit(name: str, how: str) -> None:
            exits.append((name, how))
            watched(name, how)

        launcher.on_exit = on_exit
        try:
            await c.start()
            assert sorted(launcher.handles) == ["a", "rep#0", "rep#1"]
            first = launcher.handles["rep#1"]
            assert first.alive() and first.restarts == 0 and first.describe_exit() == "still running"
            assert (tmp_path / "run" / "logs" / "rep#1.log").exists()  # each replica logs to the run directory
            handle = await c.submit({"x": 1})
            assert await asyncio.wait_for(handle.result(), 30) == {"b": {"x": 1}}
            os.kill(first.pid, signal.SIGKILL)
            deadline = asyncio.get_running_loop().time() + 30
            while not (launcher.handles["rep#1"] is not first and c.healthy):
                assert asyncio.get_running_loop().time() < deadline, (exits, c.down)
                await asyncio.sleep(0.05)
            assert exits == [("rep#1", "killed by SIGKILL")] and first.pidfd == -1
            again = launcher.handles["rep#1"]
            assert again.restarts == 1 and again.pid != first.pid and again.alive()
        finally:
            await c.close()
        assert not any(h.alive() for h in launcher.handles.values())
        assert exits == [("rep#1", "killed by SIGKILL")]  # a stop is not reported as a death

    asyncio.run(main())


def test_an_elastic_replica_is_forked_from_the_template_and_watched_killed_and_stopped_as_any(tmp_path: Path) -> None:
    # The template (omnictl.stage.template) forks a replica of an elastic process: it reports
    # ready, its SIGKILL is reported through the template, and nothing outlives the stop.
    from omnictl.coordinator.coordinator import Coordinator
    from omnictl.coordinator.forking import ForkedProcess
    from omnictl.topology import load
    from tests.support import topo

    path = topo.write(tmp_path / "t.yaml", [
        {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"]},
        {"name": "b", "factory": "omnictl.models.examples.identity", "terminal": True, "process": "rep"},
    ], processes={"rep": {"replicas": {"min": 1, "max": 2, "window": 100, "idle": 100}}})

    async def main() -> None:
        exits: list[tuple[str, str]] = []
        c = Coordinator(load(path), LaunchConfig.of(ready_timeout=60.0))
        launcher = c.launcher
        assert isinstance(launcher, Launcher)
        watched = c.on_process_exit

        def on_exit(name: str, how: str) -> None:
            exits.append((name, how))
            watched(name, how)

        launcher.on_exit = on_exit
        loop = asyncio.get_running_loop()
        try:
            await c.start()
            assert not isinstance(launcher.handles["rep#0"].process, ForkedProcess)  # the launch's: fresh
            template = launcher._template
            assert template is not None
            deadline = loop.time() + 30
            while not template.ready:
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            began = loop.time()
            forked = launcher.start("rep#1")
            assert isinstance(forked.process, ForkedProcess) and forked.pid != template.process.pid
            await asyncio.wait_for(forked.ready, 10)
            took = loop.time() - began
            os.kill(forked.pid, signal.SIGKILL)
            while forked.alive():
                assert loop.time() < deadline
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            assert exits == [("rep#1", "killed by SIGKILL")], took  # reported by the template
            again = launcher.start("rep#1")
            await asyncio.wait_for(again.ready, 10)
            assert again.pid != forked.pid
            # the template dies: its child goes with it, reported so; later starts are fresh
            template.process.kill()
            while again.alive():
                assert loop.time() < deadline
                await asyncio.sleep(0.02)
            assert exits[1:] == [("rep#1", "its template process exited (code -9)")]
            fresh = launcher.start("rep#1")
            assert not isinstance(fresh.process, ForkedProcess)
            await asyncio.wait_for(fresh.ready, 30)
        finally:
            await c.close()
        assert not fresh.alive() and template.process.poll() is not None
        assert not _running(again.pid) and not _running(template.process.pid)
        assert len(exits) == 2  # a stop is not reported as a death

    asyncio.run(main())


def _running(pid: int) -> bool:
    """Not a zombie: an orphan (the killed template's child) waits for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
