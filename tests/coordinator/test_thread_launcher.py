"""The thread launcher (``launcher="threads"``): every replica a thread of this process,
reached over the same sockets and shared memory as the local launcher's processes."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from tests.support import topo
from tests.support.loop import LoopThread, launch

E = "omnictl.models.examples"


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def _stage_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("omnictl-stage-"))


def _children() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def test_a_pipeline_of_threads_serves_across_its_processes_and_leaves_nothing(loop: LoopThread, tmp_path: Path) -> None:
    stages = [
        {"name": "a", "factory": f"{E}.append", "factory_args": {"tag": "a"}, "next": ["b"], "process": "front"},
        {"name": "b", "factory": f"{E}.append", "factory_args": {"tag": "b"}, "terminal": True, "modality": "trail",
         "process": "back"},
    ]
    path = topo.write(tmp_path / "two.yaml", stages, processes={"back": {"replicas": 2}})
    children = _children()
    pipe = launch(loop, path, profile=False, launcher="threads")
    try:
        # one thread per replica, no process started for any
        assert _stage_threads() == ["omnictl-stage-back#0", "omnictl-stage-back#1", "omnictl-stage-front"]
        assert not [p.cmdline() for p in _children() - children if "omnictl.stage.worker" in p.cmdline()]

        async def ask(i: int) -> Any:
            return await (await pipe.submit({"text": f"q{i}"})).result()

        outs = [loop.run(ask(i)) for i in range(6)]
        assert [o["b"]["text"] for o in outs] == [f"q{i}" for i in range(6)]
        assert all(o["b"]["trail"] == ["a", "b"] for o in outs)  # across the two "processes"
        assert set(pipe.process_ids().values()) == {os.getpid()}
    finally:
        loop.run(pipe.close())
    assert _stage_threads() == []  # every replica's thread ended with the launch


def test_a_replica_asked_to_end_is_reported_and_restarted(loop: LoopThread, tmp_path: Path) -> None:
    stages = [{"name": "only", "factory": f"{E}.identity", "terminal": True, "modality": "out"}]
    pipe = launch(loop, topo.write(tmp_path / "one.yaml", stages), profile=False, launcher="threads", max_restarts=1)
    try:
        launcher = pipe._coordinator.launcher
        first = launcher.handles["only"]
        first.kill()  # a thread cannot be killed: its worker stops, and the coordinator hears it ended

        async def back() -> bool:
            import asyncio

            for _ in range(500):
                handle = launcher.handles["only"]
                if handle is not first and handle.ready.done() and pipe.healthy:
                    return True
                await asyncio.sleep(0.01)
            return False

        assert loop.run(back())
        assert first.describe_exit() == "its worker stopped" and not first.alive()
        assert launcher.handles["only"].restarts == 1

        async def ask() -> Any:
            return await (await pipe.submit({"text": "again"})).result()

        assert loop.run(ask())["only"]["text"] == "again"
    finally:
        loop.run(pipe.close())


@pytest.mark.parametrize("word", ["first", "second"])
def test_user_code_beside_the_topology_is_imported_for_the_launch_and_forgotten_after(
        loop: LoopThread, tmp_path: Path, word: str) -> None:
    # Two launches one after the other, each with its own `mystages.py`: each sees its own.
    (tmp_path / "mystages.py").write_text(f"def make():\n    return lambda data: {{'said': {word!r}}}\n")
    stages = [{"name": "only", "factory": "mystages.make", "terminal": True, "modality": "out"}]
    path = topo.write(tmp_path / "user.yaml", stages)
    pipe = launch(loop, path, profile=False, launcher="threads")
    try:
        assert str(tmp_path) in sys.path

        async def ask() -> Any:
            return await (await pipe.submit({"text": "x"})).result()

        assert loop.run(ask())["only"] == {"said": word}
    finally:
        loop.run(pipe.close())
    assert str(tmp_path) not in sys.path and "mystages" not in sys.modules
