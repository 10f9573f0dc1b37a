"""Shared memory sent to a stage process that is killed before it reads it comes back
(found by the chaos soak: the sender's slots stayed "in use" for good, one leak per kill
that caught a payload in flight, until the pool ran on dedicated segments only)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Two stage processes started, one killed and restarted: ~10 s on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

E = "omnictl.models.examples"
BIG = 64 * 1024  # float32 elements: 256 KiB, over the inline limit, so every hop is a shared-memory slot


def two_processes(tmp_path: Path) -> Path:
    return topo.write(tmp_path / "two.yaml", [
        {"name": "a", "factory": f"{E}.identity", "next": ["b"], "process": "one"},
        {"name": "b", "factory": f"{E}.identity", "terminal": True, "process": "two"},
    ])


def _slots(pipe: Any, loop: LoopThread, stage: str) -> int:
    return int(loop.run(pipe.stats(timeout=0.5))[stage].get("slots_in_use", -1))


@pytest.mark.parametrize("victim", ["one", "two"])
def test_slots_in_flight_to_a_killed_process_are_released(loop: LoopThread, tmp_path: Path, victim: str) -> None:
    """``two`` killed: stage a's slots (sent to it) come back. ``one`` killed: the
    coordinator's (the submitted inputs) come back."""
    pipe = launch(loop, two_processes(tmp_path), profile=False, max_restarts=1, replay_limit=0)  # the killed request fails
    coordinator_pool = pipe._coordinator._pool  # the coordinator's slots are in no stage's stats
    try:
        payload = {"blob": np.ones(BIG, dtype=np.float32)}
        assert loop.run(loop.run(pipe.submit(payload)).result())["b"]["blob"].size == BIG
        # The result can be back before ``two`` has handed a's slot back (it does once the
        # view is freed, after sending the output): wait for it, or the stop would hold it too.
        assert until(lambda: _slots(pipe, loop, "a") == 0 and coordinator_pool.in_use == 0, timeout=10), (
            _slots(pipe, loop, "a"), coordinator_pool.in_use)
        pid = pipe.process_ids()[victim]
        os.kill(pid, signal.SIGSTOP)  # it reads nothing more: what is sent to it stays in flight
        handles = [loop.run(pipe.submit(payload)) for _ in range(2)]
        if victim == "two":
            assert until(lambda: _slots(pipe, loop, "a") == 2, timeout=10)
        else:
            assert coordinator_pool.in_use == 2
        os.kill(pid, signal.SIGKILL)
        for handle in handles:
            with pytest.raises(Exception):
                loop.run(handle.result())
        assert until(lambda: pipe.healthy and pipe.process_ids()[victim] != pid, timeout=60)
        assert until(lambda: _slots(pipe, loop, "a") == 0 and coordinator_pool.in_use == 0, timeout=10), (
            _slots(pipe, loop, "a"), coordinator_pool.in_use)
        # and the pipeline still serves, through the same slots
        assert loop.run(loop.run(pipe.submit(payload)).result())["b"]["blob"].size == BIG
    finally:
        for name, process_id in pipe.process_ids().items():
            try:
                os.kill(process_id, signal.SIGCONT)
            except ProcessLookupError:
                pass
        loop.run(pipe.close())


def test_a_killed_senders_segments_are_unmapped_by_its_readers_without_more_traffic(loop: LoopThread, tmp_path: Path) -> None:
    """Process ``two`` read from ``one``'s pool; ``one`` is killed and nothing else is sent:
    ``two`` must not keep the dead pool mapped (its name is unlinked, its memory held)."""
    pipe = launch(loop, two_processes(tmp_path), profile=False, max_restarts=1, replay_limit=0)  # the killed request fails
    try:
        assert loop.run(loop.run(pipe.submit({"blob": np.ones(BIG, dtype=np.float32)})).result())["b"]["blob"].size == BIG
        sender, reader = pipe.process_ids()["one"], pipe.process_ids()["two"]
        maps = Path(f"/proc/{reader}/maps")
        assert f"/dev/shm/omx{sender}_" in maps.read_text()
        os.kill(sender, signal.SIGKILL)
        assert until(lambda: pipe.healthy and pipe.process_ids()["one"] != sender, timeout=60)
        assert until(lambda: f"/dev/shm/omx{sender}_" not in maps.read_text(), timeout=10)
    finally:
        loop.run(pipe.close())
