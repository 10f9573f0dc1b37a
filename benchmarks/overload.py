"""Overload: offered load 5x the pipeline's capacity, with and without admission control.

A one-stage HTTP server (``think``: 50 ms of work per request, one at a time, so a
capacity of ~20 requests/s) is measured unloaded (closed loop, one request at a time),
then offered 5x its capacity open loop for ``--seconds`` twice: with admission control
(``--max-in-flight`` small) and with the limit off (``--max-in-flight 0``). Reported side
by side: sent, completed, refused (429), failed, goodput, the accepted requests' p50/p99
against the unloaded p99, and the server's RSS at the start and its peak.

Goal: with admission control the accepted p99 stays within 2x the unloaded p99 and RSS
stays flat; without it, latency grows with the queue.

Run: ``python benchmarks/overload.py [--seconds 10] [--max-in-flight 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil
import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
WORK_S = 0.05
BODY = {"model": "overload", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Run:
    label: str
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    failed: int = 0
    sent: int = 0
    seconds: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0


def _start(topology: Path, max_in_flight: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", str(topology), "--port", "0", "--no-dashboard",
               "--max-in-flight", str(max_in_flight)]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # type: ignore[union-attr]
            return process, found.group(1)
    raise SystemExit("omnictl serve did not start")


def _rss(process: subprocess.Popen[str]) -> int:
    """The server and its stage processes, together."""
    parent = psutil.Process(process.pid)
    return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])


async def _one(client: httpx.AsyncClient, url: str, run: Run) -> None:
    started = time.perf_counter()
    response = await client.post(url + "/v1/chat/completions", json=BODY)
    if response.status_code == 200:
        run.latencies.append(time.perf_counter() - started)
    elif response.status_code == 429:
        run.refused += 1
    else:
        run.failed += 1


async def _unloaded(url: str, count: int) -> Run:
    run = Run("unloaded")
    async with httpx.AsyncClient(timeout=300) as client:
        for _ in range(count):
            run.sent += 1
            await _one(client, url, run)
    return run


async def _offer(url: str, rate: float, seconds: float, run: Run, process: subprocess.Popen[str]) -> Run:
    run.rss_start = run.rss_peak = _rss(process)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        while (now := time.perf_counter() - start) < seconds:
            while run.sent < int(now * rate) + 1:
                run.sent += 1
                tasks.append(asyncio.create_task(_one(client, url, run)))
            run.rss_peak = max(run.rss_peak, _rss(process))
            await asyncio.sleep(0.01)
        while not all(t.done() for t in tasks):
            run.rss_peak = max(run.rss_peak, _rss(process))
            await asyncio.sleep(0.1)
        run.seconds = time.perf_counter() - start
    return run


def _measure(topology: Path, max_in_flight: int, label: str, seconds: float, unloaded_n: int) -> tuple[Run, Run]:
    process, url = _start(topology, max_in_flight)
    try:
        base = asyncio.run(_unloaded(url, unloaded_n))
        capacity = 1.0 / WORK_S
        run = asyncio.run(_offer(url, 5 * capacity, seconds, Run(label), process))
        return base, run
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-in-flight", type=int, default=2)
    parser.add_argument("--unloaded", type=int, default=40, help="requests measured one at a time first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        topology = Path(tmp) / "overload.yaml"
        topology.write_text(yaml.safe_dump({"name": "overload", "stages": [
            {"name": "answer", "factory": "benchmarks.overload_stages.think", "factory_args": {"seconds": WORK_S},
             "terminal": True, "modality": "text"}]}))
        base, limited = _measure(topology, args.max_in_flight, f"admission (--max-in-flight {args.max_in_flight})",
                                 args.seconds, args.unloaded)
        _, unlimited = _measure(topology, 0, "limit off (--max-in-flight 0)", args.seconds, 5)
    unloaded_p99 = _p(base.latencies, 99)
    table = Table(title=f"overload: 5x capacity ({5 / WORK_S:.0f} req/s offered for {args.seconds:g} s); "
                        f"unloaded p99 {unloaded_p99 * 1000:.0f} ms")
    for column in ("run", "sent", "completed", "429", "failed", "goodput/s", "p50 ms", "p99 ms", "p99/unloaded",
                   "RSS start MB", "RSS peak MB"):
        table.add_column(column, justify="right")
    for run in (limited, unlimited):
        p99 = _p(run.latencies, 99)
        table.add_row(run.label, str(run.sent), str(len(run.latencies)), str(run.refused), str(run.failed),
                      f"{len(run.latencies) / run.seconds:.1f}", f"{_p(run.latencies, 50) * 1000:.0f}",
                      f"{p99 * 1000:.0f}", f"{p99 / unloaded_p99:.1f}x",
                      f"{run.rss_start / 2**20:.0f}", f"{run.rss_peak / 2**20:.0f}")
    Console(width=170).print(table)


if __name__ == "__main__":
    main()
