"""Chaos soak: closed-loop load on a replicated server while stage processes are SIGKILLed.

A real ``omnictl serve`` (the topology below: an entry process with two replicas and a
two-terminal process with three, ``--max-restarts`` high) gets closed-loop chat completions (half
streamed) from ``--concurrency`` clients for ``--seconds``, while every ``--kill-every``
seconds a random stage process (a replica) is killed with SIGKILL. Every request ends as
one of: completed (the right answer), failed with an error (a status or an error event),
wrong (a 200 with another answer: a payload mixed up or overwritten), or hung (no outcome
by its per-request deadline).

Then, load and kills stopped and every process back, it checks that nothing is left:
in-flight 0 (server and coordinator), zero state in every stage and replica (requests,
buffers, queued, running, shared-memory slots: ``/health``'s ``stages``), ``/dev/shm``
segments back to the baseline taken after a warm-up (counted by the names this server's
processes create, ``omx<pid>_*``, over every pid it ever had: a killed process's segments
count too), open fds of the server and its stage processes back to the baseline, no
process left behind outside the tree (a killed process's helpers), and RSS growth per process.

Goal: 0 hung, 0 wrong, 0 leaked, over 10 minutes. Run:
``python benchmarks/chaos.py --seconds 600 [--kill-every 5] [--concurrency 8]``.
``tests/runtime/test_chaos.py`` runs 60 seconds of it through :func:`run_soak`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from omnictl.transports import shm

REPO = Path(__file__).resolve().parents[1]
MODEL = "chaos"
_URL = re.compile(r"listening on (http://\S+)")
_NUMBERS = itertools.count(1)  # request numbers (and ids) unique across warm-up and soak
_STATE_KEYS = ("requests", "fanin_buffers", "queued", "running", "stream_buffers", "kv_slots", "slots_in_use")


@dataclass
class SoakConfig:
    seconds: float = 60.0
    kill_every: float = 5.0
    concurrency: int = 8
    replicas: int = 2  # of the entry process; the other gets one more, so placements do not pair in lockstep
    warmup_s: float = 3.0
    request_deadline_s: float = 30.0  # the client's: no outcome by then is a hang
    request_timeout_s: float = 20.0  # the server's (--request-timeout): shorter, so it answers first
    settle_s: float = 60.0  # after the run: how long processes may take to be back and idle
    max_restarts: int = 100_000
    seed: int | None = None
    work_dir: Path | None = None  # server output and run directory; a temporary one if None


@dataclass
class Outcomes:
    sent: int = 0
    completed: int = 0
    failed: collections.Counter[str] = field(default_factory=collections.Counter)  # why -> count
    wrong: list[str] = field(default_factory=list)  # request ids answered with another answer
    hung: list[str] = field(default_factory=list)  # request ids with no outcome by the deadline

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())


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


@dataclass
class SoakReport:
    config: SoakConfig
    outcomes: Outcomes
    kills: list[tuple[float, str, int]]  # (seconds into the run, process, pid)
    restarts: int  # processes seen back with a new pid
    baseline: Snapshot
    after: Snapshot
    health: dict[str, Any]  # /health once settled (or when settling gave up)
    leaks: list[str]  # every way the server did not come back to its baseline
    orphans: list[int]  # pids that were under the server, are alive and no longer are
    seconds: float  # the load's duration
    server_output: Path

    @property
    def leaked(self) -> int:
        return len(self.leaks)


# --- the server ----------------------------------------------------------------------------


def write_topology(directory: Path, replicas: int) -> Path:
    """Two processes: ``front`` with ``replicas``, ``heads`` with one more (placement rotates
    ties per process: equal counts would pair front#i with heads#i only, and the warm-up would
    not open every connection). 1 MiB slots, 2 of them, so that at the soak's concurrency
    some payloads take a segment of their own (the other shared-memory path)."""
    knobs = {"slot_bytes": 1 << 20, "slots": 2}
    stages = [
        {"name": "front", "factory": "benchmarks.chaos_stages.front", "next": ["answer", "speak"], "relay": knobs},
        {"name": "answer", "factory": "benchmarks.chaos_stages.answer", "process": "heads", "terminal": True,
         "modality": "text", "relay": knobs},
        {"name": "speak", "factory": "benchmarks.chaos_stages.speak", "process": "heads", "terminal": True,
         "modality": "audio", "relay": knobs},
    ]
    document = {"name": MODEL, "stages": stages,
                "processes": {"front": {"replicas": replicas}, "heads": {"replicas": replicas + 1}}}
    path = directory / "chaos.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    output: Path

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


def start_server(config: SoakConfig, work_dir: Path, ready_timeout: float = 180.0) -> Server:
    topology = write_topology(work_dir, config.replicas)
    output = work_dir / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", str(topology), "--port", "0", "--no-dashboard",
               "--max-restarts", str(config.max_restarts), "--request-timeout", str(config.request_timeout_s),
               "--run-dir", str(work_dir / "run"), "--log-level", "warning"]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        found = _URL.search(output.read_text(errors="replace"))
        if found:
            return Server(process, found.group(1), output)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError(f"omnictl serve did not start; its output:\n{output.read_text(errors='replace')}")


# --- load ----------------------------------------------------------------------------------


def _body(number: int, words: list[str], stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream, "modalities": ["text", "audio"], "audio": {"format": "pcm16"},
            "messages": [{"role": "user", "content": f"chaos {number}: {' '.join(words)}"}]}


def _why(status: int, body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return f"{status}"
    message = str(error.get("message", ""))
    if "missed its deadline" in message:  # the server's request timeout: something inside hung
        return f"{status} deadline"
    return f"{status} {error.get('code') or error.get('type')}"


async def _streamed(client: httpx.AsyncClient, url: str, rid: str, body: dict[str, Any]) -> tuple[str, str]:
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) as response:
        if response.status_code != 200:
            raw = await response.aread()
            return "failed", _why(response.status_code, _json(raw))
        text: list[str] = []
        audio = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "done", "".join(text) if audio else ""
            event = json.loads(line[6:])
            if "error" in event:
                return "failed", _why(200, event)
            for choice in event.get("choices", ()):
                delta = choice.get("delta", {})
                text.append(delta.get("content") or "")
                audio += bool(delta.get("audio"))
        return "failed", "stream cut (no [DONE])"


async def _whole(client: httpx.AsyncClient, url: str, rid: str, body: dict[str, Any]) -> tuple[str, str]:
    response = await client.post(url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
    if response.status_code != 200:
        return "failed", _why(response.status_code, _json(response.content))
    message = response.json()["choices"][0]["message"]
    return "done", (message.get("content") or "") if message.get("audio") else ""


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def load_loop(url: str, until: float, outcomes: Outcomes, config: SoakConfig, rng: random.Random) -> None:
    """``config.concurrency`` clients, each sending its next request when the last one ended."""
    limits = httpx.Limits(max_connections=config.concurrency + 4, max_keepalive_connections=config.concurrency + 4)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            number = next(_NUMBERS)
            words = [rng.choice(("owl", "river", "lamp", "stone", "cloud", "maple")) for _ in range(rng.randint(3, 9))]
            stream = rng.random() < 0.5
            rid = f"chaos-{number}"
            outcomes.sent += 1
            call = _streamed if stream else _whole
            try:
                kind, detail = await asyncio.wait_for(call(client, url, rid, _body(number, words, stream)),
                                                      config.request_deadline_s)
            except asyncio.TimeoutError:
                outcomes.hung.append(rid)
                continue
            except httpx.HTTPError as exc:  # the server closed the connection: an outcome, not a hang
                outcomes.failed[f"connection: {type(exc).__name__}"] += 1
                continue
            if kind == "failed":
                outcomes.failed[detail] += 1
            elif detail == "echo: " + " ".join(words):
                outcomes.completed += 1
            else:
                outcomes.wrong.append(rid)

    async with httpx.AsyncClient(timeout=config.request_deadline_s + 5, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(config.concurrency)))


# --- kills and the process tree --------------------------------------------------------------


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
                      if pid not in tree and start is not None and _start_time(pid) == start and _alive(pid))


async def get_health(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await client.get(url + "/health", timeout=10)
    return response.json()


async def watch_loop(url: str, until: float, watch: Watch) -> None:
    async with httpx.AsyncClient() as client:
        while time.monotonic() < until:
            try:
                watch.see(await get_health(client, url))
            except httpx.HTTPError:
                pass  # the next poll sees it
            await asyncio.sleep(0.25)


async def kill_loop(url: str, started: float, until: float, every: float, watch: Watch, rng: random.Random,
                    kills: list[tuple[float, str, int]]) -> None:
    """Every ``every`` seconds, SIGKILL one stage process (a replica), chosen at random among
    all of them: one still starting after its last kill included."""
    async with httpx.AsyncClient() as client:
        while time.monotonic() + every < until:
            await asyncio.sleep(every)
            health = await get_health(client, url)
            watch.see(health)
            candidates = sorted((name, pid) for name, pid in health["processes"].items()
                                if _parent(pid) == watch.server_pid and _alive(pid))
            if not candidates:
                continue
            name, pid = rng.choice(candidates)
            os.kill(pid, signal.SIGKILL)
            kills.append((time.monotonic() - started, name, pid))


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(int(entry))
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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- leak accounting -----------------------------------------------------------------------


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
    live = {pid for pid in processes.values() if _alive(pid)}
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


# --- the soak ------------------------------------------------------------------------------


async def _soak(server: Server, config: SoakConfig, rng: random.Random) -> SoakReport:
    watch = Watch(server.process.pid)
    # Warm-up: every process has sent and received (pools and peer sockets exist) before the baseline.
    warm = Outcomes()
    await load_loop(server.url, time.monotonic() + config.warmup_s, warm, config, rng)
    await settle(server.url, watch, config.settle_s)
    baseline = snapshot(watch)
    outcomes = Outcomes()
    kills: list[tuple[float, str, int]] = []
    restarts_before = watch.restarts
    started = time.monotonic()
    until = started + config.seconds
    await asyncio.gather(
        load_loop(server.url, until, outcomes, config, rng),
        kill_loop(server.url, started, until, config.kill_every, watch, rng, kills),
        watch_loop(server.url, until, watch),
    )
    seconds = time.monotonic() - started
    health = await settle(server.url, watch, config.settle_s)
    after = snapshot(watch)
    orphans = watch.orphans()
    leaks = find_leaks(baseline, after, health)
    if orphans:
        leaks.append(f"processes left outside the server's tree: {orphans}")
    return SoakReport(config, outcomes, kills, watch.restarts - restarts_before, baseline, after, health, leaks,
                      orphans, seconds, server.output)


def run_soak(config: SoakConfig) -> SoakReport:
    """Start a server, soak it, stop it; the report says what happened and what leaked."""
    rng = random.Random(config.seed)
    work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="omnictl-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    server = start_server(config, work_dir)
    try:
        return asyncio.run(_soak(server, config, rng))
    finally:
        server.stop()


# --- the report ----------------------------------------------------------------------------


def _mb(value: int) -> str:
    return f"{value / 1e6:.0f} MB"


def render(report: SoakReport) -> str:
    o, c = report.outcomes, report.config
    failed = ", ".join(f"{why}: {n}" for why, n in o.failed.most_common()) or "none"
    lines = [
        f"chaos soak: {report.seconds:.0f} s, concurrency {c.concurrency}, SIGKILL every {c.kill_every:g} s, "
        f"{c.replicas} + {c.replicas + 1} replicas",
        f"  sent {o.sent}   completed {o.completed}   failed {o.failed_total}   wrong {len(o.wrong)}   "
        f"hung {len(o.hung)}",
        f"  failed by reason: {failed}",
        f"  kills {len(report.kills)}   restarts {report.restarts}",
        f"  after: in-flight {report.health.get('in_flight')} (pipeline {report.health.get('pipeline_in_flight')}), "
        f"health {report.health.get('status')!r}, stage state held: {', '.join(stage_state(report.health)) or 'none'}",
        f"  /dev/shm segments (this server's): baseline {len(report.baseline.shm_live)}, after "
        f"{len(report.after.shm_live)} (idle bound {idle_segment_bound(report.health)}) (+{len(report.after.shm_dead)} of dead processes); mapped after their creator died: "
        f"{sum(report.after.mapped_dead.values())}; unlinked spares still mapped by a reader: "
        f"{report.baseline.mapped_unlinked} -> {report.after.mapped_unlinked}",
        f"  open fds (shared memory aside): server {report.baseline.fds['server']} -> {report.after.fds['server']}; stage processes "
        f"{sum(v for k, v in report.baseline.fds.items() if k != 'server')} -> "
        f"{sum(v for k, v in report.after.fds.items() if k != 'server')}",
        "  RSS: " + ", ".join(
            f"{name} {_mb(report.baseline.rss.get(name, 0))} -> {_mb(report.after.rss[name])}"
            + ("" if report.baseline.processes.get(name) == report.after.processes[name] else " (restarted)")
            for name in report.after.rss),
        f"  leaked: {report.leaked}" + ("" if not report.leaks else " — " + "; ".join(report.leaks)),
    ]
    if o.hung:
        lines.append(f"  hung requests (omnictl trace ID --run-dir {report.server_output.parent / 'run'}): "
                     f"{', '.join(o.hung[:10])}")
    if o.wrong:
        lines.append(f"  wrong answers: {', '.join(o.wrong[:10])}")
    lines.append(f"  server output: {report.server_output}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long the load and the kills go on")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between two SIGKILLs")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--replicas", type=int, default=2, help="replicas of the entry process (the other gets one more)")
    parser.add_argument("--seed", type=int, default=None, help="for the choice of requests and victims")
    parser.add_argument("--work-dir", type=Path, default=None, help="server output and run directory (default: a temporary one)")
    args = parser.parse_args()
    report = run_soak(SoakConfig(seconds=args.seconds, kill_every=args.kill_every, concurrency=args.concurrency,
                                 replicas=args.replicas, seed=args.seed, work_dir=args.work_dir))
    print(render(report))
    sys.exit(0 if not (report.outcomes.hung or report.outcomes.wrong or report.leaks) else 1)


if __name__ == "__main__":
    main()
