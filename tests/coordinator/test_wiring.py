"""A launch's wiring (addresses, keys, data host) resolved once, and the one function that
chooses and builds the launcher from the config, handing both launchers the same wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.coordinator.launcher import Launcher
from omnictl.coordinator.launching import build_launcher
from omnictl.coordinator.ray_launcher import RayLauncher
from omnictl.coordinator.thread_launcher import ThreadLauncher
from omnictl.coordinator.wiring import Wiring
from omnictl.launch_config import LaunchConfig
from omnictl.topology import loads

LOCAL = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: rep, terminal: true}
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


def test_a_local_launch_on_one_machine_has_ipc_addresses_and_no_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMNICTL_DATA_HOST", raising=False)
    wiring = Wiring.resolve(loads(LOCAL), LaunchConfig(), tmp_path)
    assert wiring.process_addresses == {name: f"ipc://{tmp_path}/p{i}" for i, name in enumerate(["a", "rep#0", "rep#1"])}
    assert (wiring.control_address, wiring.broadcast_address) == (f"ipc://{tmp_path}/control", f"ipc://{tmp_path}/broadcast")
    assert wiring.profile_address is None and wiring.curve is None
    assert (wiring.data_host, wiring.data_host_given) == ("127.0.0.1", None)
    assert Wiring.resolve(loads(LOCAL), LaunchConfig(), tmp_path, profiling=True).profile_address == f"ipc://{tmp_path}/profile"


def test_keys_are_made_once_when_some_process_is_reached_over_tcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNICTL_DATA_HOST", "10.0.0.9")
    wiring = Wiring.resolve(loads(LABELLED), LaunchConfig(), tmp_path)
    assert wiring.curve is not None
    assert (wiring.data_host, wiring.data_host_given) == ("10.0.0.9", "10.0.0.9")  # the variable, else...
    given = Wiring.resolve(loads(LABELLED), LaunchConfig.of(data_host="10.0.0.1"), tmp_path)
    assert (given.data_host, given.data_host_given) == ("10.0.0.1", "10.0.0.1")  # ...the config wins
    bound = wiring.with_tcp(coordinator=("tcp://h:1", "tcp://h:2"))
    bound = bound.with_tcp(profile="tcp://h:3")
    assert (bound.tcp_coordinator, bound.profile_tcp_address, bound.curve) == (
        ("tcp://h:1", "tcp://h:2"),
        "tcp://h:3",
        wiring.curve,
    )


def test_one_function_builds_each_launcher_from_the_config_and_the_same_wiring(tmp_path: Path) -> None:
    topology = loads(LABELLED)
    config = LaunchConfig.of(
        model_path="/weights", audio_policy="deadline", ray_address="ray://head:10001", data_host="10.0.0.5"
    )
    wiring = Wiring.resolve(topology, config.replace(launcher="ray"), tmp_path, profiling=True).with_tcp(
        coordinator=("tcp://h:1", "tcp://h:2"), profile="tcp://h:3"
    )
    exits: list[tuple[str, str]] = []
    local = build_launcher(topology, config, wiring, lambda name, why: exits.append((name, why)))
    assert isinstance(local, Launcher)
    assert (local.wiring, local.configs.model_path, local.configs.audio_policy) == (wiring, "/weights", "deadline")
    threads = build_launcher(topology, config.replace(launcher="threads"), wiring, lambda name, why: None)
    assert isinstance(threads, ThreadLauncher)
    assert (threads.configs.wiring, threads.configs.model_path, threads.configs.audio_policy) == (
        wiring, "/weights", "deadline")
    ray = build_launcher(topology, config.replace(launcher="ray"), wiring, lambda name, why: None)
    assert isinstance(ray, RayLauncher)  # Ray itself is not joined until the first start
    assert (ray.model_path, ray.audio_policy, ray.ray_address) == ("/weights", "deadline", "ray://head:10001")
    assert (ray.tcp_coordinator, ray.profile_address, ray.curve) == (("tcp://h:1", "tcp://h:2"), "tcp://h:3", wiring.curve)
    assert ray.data_host == wiring.data_host_given == "10.0.0.5"  # None: each worker resolves its own node's
    local.on_exit("a", "exit code 1")
    assert exits == [("a", "exit code 1")]


def test_the_ray_launcher_refuses_wiring_without_tcp_or_keys(tmp_path: Path) -> None:
    topology = loads(LOCAL)
    config = LaunchConfig.of(launcher="ray")
    with pytest.raises(ValueError, match="the Ray launcher needs the coordinator's tcp addresses"):
        build_launcher(topology, config, Wiring(tmp_path), lambda name, why: None)
