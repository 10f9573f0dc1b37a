"""Nothing leaks: not across many requests, not at shutdown, not when the parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

E = "omnictl.models.examples"
REPO = Path(__file__).resolve().parents[2]


def two_process_topology(tmp_path: Path) -> Path:
    return topo.write(
        tmp_path / "two.yaml",
        [
            {"name": "a", "factory": f"{E}.identity", "next": ["b"], "process": "one"},
            {"name": "b", "factory": f"{E}.identity", "next": ["c"], "process": "two"},
            {"name": "c", "factory": f"{E}.identity", "terminal": True, "process": "two"},
        ],
    )


def shm_entries(pids: list[int]) -> set[str]:
    """omnictl's segments created by ``pids`` (named ``omx<creator pid>_...``): /dev/shm is
    machine-wide, and other pipelines on the machine come and go meanwhile."""
    prefixes = tuple(f"omx{pid}_" for pid in pids)
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}


def open_fds(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# Longer than the suite's default deadline: ~25 s measured on a loaded 2-core machine.
@pytest.mark.timeout(120)
def test_no_growth_of_shared_memory_or_descriptors_across_a_thousand_requests(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, two_process_topology(tmp_path), profile=False)
    pids = [os.getpid(), *pipe.process_ids().values()]

    async def burst(count: int, size: int) -> None:
        for start in range(0, count, 50):
            requests = [
                await pipe.submit({"i": i, "blob": np.full(size, i, dtype=np.float32)})
                for i in range(start, min(start + 50, count))
            ]
            for i, request in enumerate(requests, start):
                out = (await request.result())["c"]
                assert out["i"] == i and out["blob"][0] == i

    try:
        # small (inline), slot-sized and oversized (dedicated segment) payloads
        for size in (16, 64 * 1024, 3 * 1024 * 1024):
            loop.run(burst(50, size))
        shm_before, fds_before = len(shm_entries(pids)), open_fds(pids)
        loop.run(burst(1000, 64 * 1024), timeout=300)
        loop.run(burst(50, 3 * 1024 * 1024))
        # Large segments are kept as spares (a bounded number per pool): count, not names.
        assert until(lambda: len(shm_entries(pids)) <= shm_before, timeout=5), (shm_before, shm_entries(pids))
        # Slot releases travel back asynchronously; a segment in flight holds a descriptor.
        assert until(lambda: open_fds(pids) <= fds_before, timeout=5), (fds_before, open_fds(pids))
        # and so do slots: the last results can be back before their inputs' slots are
        assert until(lambda: all(entry["slots_in_use"] == 0 for entry in loop.run(pipe.stats()).values()),
                     timeout=5), loop.run(pipe.stats())
    finally:
        loop.run(pipe.close())


def test_orderly_shutdown_leaves_no_process_socket_or_segment(loop: LoopThread, tmp_path: Path) -> None:
    pipe = launch(loop, two_process_topology(tmp_path), profile=False)
    pids = list(pipe.process_ids().values())
    before = shm_entries([os.getpid(), *pids])
    sockets = pipe.socket_dir

    async def one() -> Any:
        return await (await pipe.submit({"blob": np.ones(1 << 20, dtype=np.float32)})).result()

    loop.run(one())
    assert sockets.exists()
    loop.run(pipe.close())
    assert not any(alive(pid) for pid in pids)
    assert not sockets.exists()
    assert shm_entries([os.getpid(), *pids]) <= before


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, faulthandler, os, signal, sys
            import numpy as np
            import omnictl

            faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks when it hangs
            # A shell starts background jobs with SIGINT ignored, and Python keeps an ignored
            # SIGINT ignored: under `.ci/run &` the owner would never see the test's Ctrl-C.
            signal.signal(signal.SIGINT, signal.default_int_handler)

            async def main():
                async with omnictl.Pipeline.launch({str(two_process_topology(tmp_path))!r}, profile=False) as pipe:
                    await (await pipe.submit({{"blob": np.ones(1 << 20, dtype=np.float32)}})).result()
                    print(" ".join(str(p) for p in pipe.process_ids().values()), pipe.socket_dir, flush=True)
            {textwrap.indent(textwrap.dedent(body), "        ")}

            asyncio.run(main())
            """
        )
    )
    return script


def _start(script: Path) -> tuple[subprocess.Popen[str], list[int], Path]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    assert owner.stdout is not None
    *pids, sockets = owner.stdout.readline().split()
    return owner, [int(p) for p in pids], Path(sockets)


def test_children_exit_when_the_parent_is_killed(tmp_path: Path) -> None:
    owner, pids, _ = _start(_script(tmp_path, "await asyncio.sleep(600)"))
    creators = [owner.pid, *pids]  # the segments all come and go after the start-up request
    assert pids and all(alive(pid) for pid in pids)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert until(lambda: not any(alive(pid) for pid in pids), timeout=15)
    assert until(lambda: not shm_entries(creators), timeout=10), shm_entries(creators)


def test_sigint_shuts_down_cleanly(tmp_path: Path) -> None:
    owner, pids, sockets = _start(_script(tmp_path, "await asyncio.sleep(600)"))
    owner.send_signal(signal.SIGINT)
    # Closing the pipeline must not raise on the way out: then the KeyboardInterrupt is
    # what ends the owner, and Python exits as killed by SIGINT (a traceback would be 1).
    try:
        code = owner.wait(timeout=30)
    except subprocess.TimeoutExpired:
        owner.send_signal(signal.SIGUSR1)  # every thread's stack, to say where it hangs
        time.sleep(1)
        owner.kill()
        raise AssertionError(f"the owner did not exit within 30 s of SIGINT:\n{owner.communicate()[1]}") from None
    assert code == -signal.SIGINT
    assert not any(alive(pid) for pid in pids)
    assert not sockets.exists()
    assert not shm_entries([owner.pid, *pids])
