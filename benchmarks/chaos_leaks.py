"""The chaos soak's accounting: the server's process tree over time (pids with their start
times), and what it holds at one moment (/dev/shm by its processes' names, mappings, fds,
RSS, every stage's state) against a baseline."""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from omnictl.transports import shm

_STATE_KEYS = ("requests", "fanin_buffers", "queued", "running", "stream_buffers", "kv_slots", "slots_in_use")


@dataclass
class Snapshot:
    """What the server and its processes hold at one moment."""

    processes: dict[str, int]  # name (``server``, ``front#0``...) -> pid
    shm_live: list[str]  # /dev/shm segments of live processes
    shm_dead: list[str]  # /dev/shm segments of processes that no longer exist
    mapped_dead: dict[str, int]  # name -> segments of dead processes it still maps (their memory held)
    mapped_unlinked: int  # segments of live processes unlinked and still mapped (bounded: a reader maps 16)
    fds: dict[str, int]  # name -> open fds, shared-memory mappings left out (counted above)
    rss: dict[str, int]  # name -> bytes


class Watch:
    """Polls the server's /health: the stage processes' pids (every pid each had counts for
    shared memory), restarts (a process back with a new pid) and the process tree.

    Pids are remembered with their start time: pids are reused (32768 of them here, on a
    machine shared with other programs), and a reused one is someone else's process."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.current: dict[str, int] = {}
        self.ever: dict[int, int | None] = {server_pid: _start_time(server_pid)}  # pid -> start time
        self.tree_ever: dict[int, int | None] = {}
        self.restarts = 0

    def see(self, health: dict[str, Any]) -> None:
        for name, pid in health.get("processes", {}).items():
            if name in self.current and self.current[name] != pid:
                self.restarts += 1
            self.current[name] = pid
            self.ever.setdefault(pid, _start_time(pid))
        for pid in descendants(self.server_pid):
            self.tree_ever.setdefault(pid, _start_time(pid))

    def ours(self) -> set[int]:
        """Every pid the server and its stage processes had that is not someone else's now."""
        return {pid for pid, start in self.ever.items() if _start_time(pid) in (None, start)}

    def orphans(self) -> list[int]:
        """Processes once under the server, alive and no longer under it (a killed process's helpers)."""
        tree = descendants(self.server_pid)
        return sorted(pid for pid, start in self.tree_ever.items()
                      if pid not in tree and start is not None and _start_time(pid) == start and alive(pid))


async def get_health(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await client.get(url + "/health", timeout=10)
    return response.json()


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = parent_of(int(entry))
            if parent is not None:
                children[parent].append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _start_time(pid: int) -> int | None:
    """Clock ticks after boot when ``pid`` started; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def shm_segments(pids: set[int]) -> list[str]:
    """The /dev/shm segments created by these processes (named ``omx<pid>_...``): the
    directory is shared with every other program on the machine."""
    prefixes = tuple(f"omx{pid}_" for pid in pids)
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefixes))


def _fds(pid: int) -> int:
    """Open fds but shared-memory segments (a mapping holds one; they have their own count)."""
    count = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                count += not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/")
            except FileNotFoundError:
                pass  # closed meanwhile
    except FileNotFoundError:
        pass
    return count


def _unlinked_mappings(pid: int) -> set[str]:
    """The segments ``pid`` maps whose names were unlinked."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split()[-2].rsplit("/", 1)[1] for line in maps
                    if "/dev/shm/omx" in line and line.endswith("(deleted)\n")}
    except FileNotFoundError:
        return set()


def _creator(segment: str) -> int:
    return int(segment[3:].split("_", 1)[0])


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except FileNotFoundError:
        return 0


def snapshot(watch: Watch) -> Snapshot:
    processes = {"server": watch.server_pid, **watch.current}
    live = {pid for pid in processes.values() if alive(pid)}
    segments = shm_segments(watch.ours())
    unlinked = {name: _unlinked_mappings(pid) for name, pid in processes.items()}
    return Snapshot(
        processes=processes,
        shm_live=[s for s in segments if _creator(s) in live],
        shm_dead=[s for s in segments if _creator(s) not in live],
        mapped_dead={name: sum(_creator(s) not in live for s in held) for name, held in unlinked.items()},
        mapped_unlinked=sum(_creator(s) in live for held in unlinked.values() for s in held),
        fds={name: _fds(pid) for name, pid in processes.items()},
        rss={name: _rss(pid) for name, pid in processes.items()},
    )


def stage_state(health: dict[str, Any]) -> list[str]:
    """Every nonzero state counter of every stage (and replica): what should be 0 when idle."""
    held = []
    for stage, entry in health.get("stages", {}).items():
        for where, counters in [(stage, entry), *((f"{stage}@{r}", c) for r, c in entry.get("replicas", {}).items())]:
            held += [f"{where}.{key}={counters[key]}" for key in _STATE_KEYS if counters.get(key)]
    return held


def _idle(health: dict[str, Any]) -> bool:
    return (health.get("status") == "ok" and health.get("in_flight") == 0 and health.get("pipeline_in_flight") == 0
            and not stage_state(health) and all(e.get("status") == "up" for e in health.get("stages", {}).values()))


async def settle(url: str, watch: Watch, timeout: float) -> dict[str, Any]:
    """/health once every process is up and idle (slot releases travel back asynchronously),
    or the last one seen at the timeout."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                health = await get_health(client, url)
                watch.see(health)
                if _idle(health) or time.monotonic() > deadline:
                    return health
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    return {}
            await asyncio.sleep(0.25)


def idle_segment_bound(health: dict[str, Any]) -> int:
    """The most segments the server's processes may own when idle: per sending pool (the
    coordinator's, and one per stage in each replica) its slots' segment plus the spares it
    keeps. The warm-up's count is below it when fewer payloads overflowed the slots then."""
    pools = 1 + sum(len(entry.get("replicas", ())) or 1 for entry in health.get("stages", {}).values())
    return pools * (1 + shm._SPARE_SEGMENTS)


def find_leaks(baseline: Snapshot, after: Snapshot, health: dict[str, Any]) -> list[str]:
    leaks = []
    if health.get("status") != "ok":
        leaks.append(f"health {health.get('status')!r} (down: {health.get('replicas_down')})")
    for key in ("in_flight", "pipeline_in_flight"):
        if health.get(key) != 0:
            leaks.append(f"{key} {health.get(key)}")
    leaks += [f"stage state {held}" for held in stage_state(health)]
    if after.shm_dead:
        leaks.append(f"/dev/shm: {len(after.shm_dead)} segments of dead processes ({', '.join(after.shm_dead[:4])})")
    held = {name: n for name, n in after.mapped_dead.items() if n}
    if held:
        leaks.append(f"segments of dead processes still mapped: {held}")
    bound = idle_segment_bound(health)
    if len(after.shm_live) > max(len(baseline.shm_live), bound):
        leaks.append(f"/dev/shm: {len(after.shm_live)} segments of live processes, baseline {len(baseline.shm_live)}, "
                     f"idle bound {bound}")
    if after.fds["server"] > baseline.fds["server"]:
        leaks.append(f"server fds {after.fds['server']}, baseline {baseline.fds['server']}")
    stage_fds = sum(n for name, n in after.fds.items() if name != "server")
    stage_base = sum(n for name, n in baseline.fds.items() if name != "server")
    if stage_fds > stage_base:
        leaks.append(f"stage processes' fds {stage_fds}, baseline {stage_base}")
    return leaks
