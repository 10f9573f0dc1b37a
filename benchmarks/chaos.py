"""Chaos soak: closed-loop load on a replicated server while stage processes are SIGKILLed.

A real ``omnictl serve`` (the topology below: an entry process with two replicas and a
two-terminal process with three, ``--max-restarts`` high) gets closed-loop chat completions
from ``--concurrency`` clients for ``--seconds``, while every ``--kill-every`` seconds a
random stage process (a replica) is killed with SIGKILL. ``--text-only`` of them (30 %) ask
for text alone, streamed: the text terminal is autoregressive (greedy and certain), so a
kill mid-answer resumes the stream elsewhere with the tokens its client has forced, and each
resumed stream (the coordinator logs one line per resume) must join to exactly the clean
greedy text; the others ask for text and audio, half of them streamed. Every request ends as
one of: completed (the right answer), failed with an error (a status or an error event;
before or after its client saw output), wrong (a 200 with another answer: a payload mixed
up or overwritten, or a resumed stream with a token repeated or missing), or hung (no
outcome by its per-request deadline). Replayed and resumed requests are the server's
``/metrics`` counters.

Then, load and kills stopped and every process back, it checks that nothing is left:
in-flight 0 (server and coordinator), zero state in every stage and replica (requests,
buffers, queued, running, shared-memory slots: ``/health``'s ``stages``), ``/dev/shm``
segments back to the baseline taken after a warm-up (counted by the names this server's
processes create, ``omx<pid>_*``, over every pid it ever had: a killed process's segments
count too), open fds of the server and its stage processes back to the baseline, no
process left behind outside the tree (a killed process's helpers), and RSS growth per process.

Goal: 0 failed among requests that had shown no output, 0 repeated or missing tokens in
resumed streams, 0 hung, 0 ended by the server's deadline (hung inside until the request
timeout), 0 wrong, 0 leaked, over 10 minutes. Run:
``python benchmarks/chaos.py --seconds 600 [--kill-every 5] [--concurrency 8]``.
``tests/runtime/test_chaos.py`` runs 40 seconds of it (a kill every 5 s) through :func:`run_soak`. The parts:
``chaos_load.py`` (the server, the clients, the kills), ``chaos_leaks.py`` (the process
tree and what the server holds), ``chaos_stages.py`` (the topology's stages).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script (python benchmarks/chaos.py): its modules import as benchmarks.*
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chaos_leaks import Snapshot, Watch, find_leaks, idle_segment_bound, settle, snapshot, stage_state
from benchmarks.chaos_load import (
    _REFUSED_PAUSE_S,
    Outcomes,
    Server,
    SoakConfig,
    kill_loop,
    load_loop,
    start_server,
    watch_loop,
)

__all__ = ["SoakConfig", "SoakReport", "render", "run_soak"]
_RECHECK_S = 5.0
# the coordinator's line for each resume (a warning: the soak's server logs at that level)
_RESUMED = re.compile(r"request (\S+): resumed with the tokens its caller has forced")


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
    replayed: int = 0  # requests the server re-ran from the entry (its /metrics counter)
    resumed: int = 0  # of those, autoregressive streams resumed with the tokens their client had (/metrics)
    resumed_ids: list[str] = field(default_factory=list)  # the resumed requests, from the server's log lines

    @property
    def resumed_streams(self) -> tuple[int, list[str], list[str]]:
        """Of the resumed text-only streams: how many joined to the clean greedy text, the ids
        of those that did not (a repeated or missing token), and of those that failed."""
        equal, differ, failed = 0, [], []
        for rid in self.resumed_ids:
            if rid not in self.outcomes.text_streams:
                continue  # a text-and-audio stream resumed before its audio began: checked as any answer
            clean, joined = self.outcomes.text_streams[rid]
            if joined is None:
                failed.append(rid)
            elif joined == clean:
                equal += 1
            else:
                differ.append(rid)
        return equal, differ, failed

    @property
    def leaked(self) -> int:
        return len(self.leaks)


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
    replayed, resumed = await _replayed(server.url)
    # Closing happens after the fact (a client's connection, a killed process's helper
    # finishing its clean-up): look again for a few seconds before calling anything a leak.
    deadline = time.monotonic() + _RECHECK_S
    while True:
        after = snapshot(watch)
        orphans = watch.orphans()
        leaks = find_leaks(baseline, after, health)
        if orphans:
            leaks.append(f"processes left outside the server's tree: {orphans}")
        if not leaks or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    resumed_ids = _RESUMED.findall(server.output.read_text(errors="replace"))
    return SoakReport(config, outcomes, kills, watch.restarts - restarts_before, baseline, after, health, leaks,
                      orphans, seconds, server.output, replayed, resumed, resumed_ids)


async def _replayed(url: str) -> tuple[int, int]:
    """The server's replayed and resumed counters (/metrics)."""
    async with httpx.AsyncClient() as client:
        metrics = (await client.get(url + "/metrics", timeout=10)).text

    def counter(name: str) -> int:
        found = re.search(rf"^{name}_total (\S+)$", metrics, re.MULTILINE)
        return int(float(found.group(1))) if found else 0

    return counter("omnictl_requests_replayed"), counter("omnictl_requests_resumed")


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


def _mb(value: int) -> str:
    return f"{value / 1e6:.0f} MB"


def render(report: SoakReport) -> str:
    o, c = report.outcomes, report.config
    equal, differ, failed_resumed = report.resumed_streams
    failed = ", ".join(f"{why}: {n}" for why, n in o.failed.most_common()) or "none"
    lines = [
        f"chaos soak: {report.seconds:.0f} s, concurrency {c.concurrency}, SIGKILL every {c.kill_every:g} s, "
        f"{c.replicas} + {c.replicas + 1} replicas",
        f"  sent {o.sent}   completed {o.completed}   failed {o.failed_total}   wrong {len(o.wrong)}   "
        f"hung {len(o.hung)}   ended by the server's deadline {o.deadline_ended}",
        f"  failed by reason: {failed}",
        f"  replayed {report.replayed} (re-run from the entry, --replay-limit {c.replay_limit})   resumed "
        f"{report.resumed} (autoregressive text streams cut mid-answer, continued with the tokens their client had "
        f"forced; {len(report.resumed_ids)} logged)   failed before any output {o.failed_before_output}   "
        f"failed after output {o.failed_after_output}   hung {len(o.hung)}   leaked {report.leaked}",
        f"  resumed text-only streams: {equal} of {equal + len(differ) + len(failed_resumed)} joined to exactly the clean "
        f"greedy text; repeated or missing tokens in {len(differ)}; failed after the resume {len(failed_resumed)} "
        f"({len(o.text_streams)} text-only streamed requests, {c.text_only:.0%} of the load)",
        f"  of the {o.failed_before_output} failed before any output: {o.refused} refused at admission (503: every "
        f"replica of a process down at that moment; the client then pauses {_REFUSED_PAUSE_S:g} s), "
        f"{o.failed_before_output - o.refused} admitted and lost",
        f"  kills {len(report.kills)}   restarts {report.restarts}   restarts that failed (killed again while "
        f"starting): {report.server_output.read_text(errors='replace').count('could not be restarted')}",
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
    goal = o.failed_before_output == 0 and not differ and not o.hung and not report.leaks
    lines.append(f"  goal (0 failed among requests with no output yet, 0 repeated or missing tokens in resumed text "
                 f"streams, 0 hung, 0 leaked): {'met' if goal else 'not met'}"
                 + ("" if o.failed_before_output == 0 else f" — {o.failed_before_output} failed before any output")
                 + ("" if report.resumed else " — no stream was resumed: the resume went unexercised"))
    if o.hung:
        lines.append(f"  hung requests (omnictl trace ID --run-dir {report.server_output.parent / 'run'}): "
                     f"{', '.join(o.hung[:10])}")
    if o.wrong:
        lines.append(f"  wrong answers: {', '.join(o.wrong[:10])}")
    if differ or failed_resumed:
        lines.append(f"  resumed streams that differ: {', '.join(differ[:10]) or 'none'}; failed: "
                     f"{', '.join(failed_resumed[:10]) or 'none'}")
    lines.append(f"  server output: {report.server_output}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long the load and the kills go on")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between two SIGKILLs")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--replicas", type=int, default=2, help="replicas of the entry process (the other gets one more)")
    parser.add_argument("--seed", type=int, default=None, help="for the choice of requests and victims")
    parser.add_argument("--replay-limit", type=int, default=1, help="the server's --replay-limit (0: no replays)")
    parser.add_argument("--text-only", type=float, default=0.3,
                        help="the share of requests streamed as text alone (the autoregressive answer: resumable)")
    parser.add_argument("--work-dir", type=Path, default=None, help="server output and run directory (default: a temporary one)")
    args = parser.parse_args()
    report = run_soak(SoakConfig(seconds=args.seconds, kill_every=args.kill_every, concurrency=args.concurrency,
                                 replicas=args.replicas, seed=args.seed, work_dir=args.work_dir,
                                 replay_limit=args.replay_limit, text_only=args.text_only))
    print(render(report))
    o = report.outcomes
    sys.exit(0 if not (o.hung or o.deadline_ended or o.wrong or report.leaks or report.resumed_streams[1]) else 1)


if __name__ == "__main__":
    main()
