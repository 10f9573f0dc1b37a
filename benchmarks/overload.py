"""Overload: offered load 5x the pipeline's capacity, with and without admission control.

Default mode: a one-stage HTTP server (``think``: 50 ms of work per request, one at a
time, so a capacity of ~20 requests/s). ``--voice``: the embedded voice assistant
(``topologies/voice-assistant.yaml``), typed questions answered as text (the thinker,
SmolLM2-135M, batches them); its capacity is measured first (closed loop, ``--voice-concurrency``
at once). Each is measured unloaded (closed loop, one request at a time), then offered 5x
its capacity open loop for ``--seconds``, three times, each run on a fresh server:

- ``--max-in-flight N`` (``--max-in-flight``, default 1): the documented operator setting,
  about as many requests as the pipeline serves at once without slowing each one;
- the server's defaults (``--max-in-flight 64``, every stage's ``relay.inbox`` 32);
- everything off: ``--max-in-flight 0`` and an inbox bound too large to matter.

Reported side by side: sent, completed, refused (429), failed, goodput, the accepted
requests' p50/p99 (at the client) against the unloaded p99, the server's own p99 from
admission to result (``omnictl_request_latency_seconds``: the bucket bound holding it),
how long a 429 took (time spent in the HTTP layer before admission, which grows when the
server's CPU is short), and the RSS (server plus stage processes) at the start and its peak.

Goal: with admission control the accepted p99 stays within 2x the unloaded p99 and RSS
stays flat; without it, latency grows with the queue.

Run: ``python benchmarks/overload.py [--seconds 10] [--max-in-flight 2] [--voice]``
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
from typing import Callable, TypeVar

import httpx
import numpy as np
import psutil
import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
WORK_S = 0.05
VOICE_TOPOLOGY = REPO / "topologies" / "voice-assistant.yaml"
QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?", "What color is the sky?",
             "Name a large planet.", "What do bees make?", "What is two plus two?"]


@dataclass(frozen=True)
class Target:
    """What is served and what each request asks."""

    topology: Path
    model: str
    text_only: bool  # ask for the text modality alone (the voice assistant also speaks)

    def body(self, index: int) -> dict[str, object]:
        body: dict[str, object] = {"model": self.model,
                                   "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]}
        if self.text_only:
            body["modalities"] = ["text"]
        return body


@dataclass
class Run:
    label: str
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    refusal_latencies: list[float] = field(default_factory=list)  # time to a 429: the HTTP layer's queue
    server_p99: float = float("nan")  # admission to result, from the server's histogram (a bucket bound)
    failed: int = 0
    sent: int = 0
    seconds: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0


def _start(topology: Path, serve_args: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", str(topology), "--port", "0", "--no-dashboard",
               *serve_args]
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


async def _one(client: httpx.AsyncClient, url: str, target: Target, index: int, run: Run) -> None:
    started = time.perf_counter()
    response = await client.post(url + "/v1/chat/completions", json=target.body(index))
    if response.status_code == 200:
        run.latencies.append(time.perf_counter() - started)
    elif response.status_code == 429:
        run.refused += 1
        run.refusal_latencies.append(time.perf_counter() - started)
    else:
        run.failed += 1


async def _closed_loop(url: str, target: Target, concurrency: int, count: int) -> Run:
    """``count`` requests, ``concurrency`` at a time; ``seconds`` is how long they took."""
    run = Run(f"closed loop x{concurrency}")
    async with httpx.AsyncClient(timeout=300) as client:
        async def worker() -> None:
            while run.sent < count:
                run.sent += 1
                await _one(client, url, target, run.sent, run)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - started
    return run


async def _offer(url: str, target: Target, rate: float, seconds: float, run: Run,
                 process: subprocess.Popen[str]) -> Run:
    run.rss_start = run.rss_peak = _rss(process)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        while (now := time.perf_counter() - start) < seconds:
            while run.sent < int(now * rate) + 1:
                run.sent += 1
                tasks.append(asyncio.create_task(_one(client, url, target, run.sent, run)))
            run.rss_peak = max(run.rss_peak, _rss(process))
            await asyncio.sleep(0.01)
        while not all(t.done() for t in tasks):
            run.rss_peak = max(run.rss_peak, _rss(process))
            await asyncio.sleep(0.1)
        run.seconds = time.perf_counter() - start
        run.server_p99 = _histogram_p99((await client.get(url + "/metrics")).text, "omnictl_request_latency_seconds")
    return run


def _histogram_p99(metrics: str, name: str) -> float:
    """The upper bound of the bucket holding the 99th percentile of a Prometheus histogram."""
    buckets = [(float(bound), float(count)) for bound, count in
               re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', metrics, re.MULTILINE)]
    total = buckets[-1][1] if buckets else 0.0
    return next((bound for bound, count in buckets if count >= 0.99 * total), float("nan")) if total else float("nan")


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _serve(target: Target, topology: Path, serve_args: list[str],
           work: Callable[[str, subprocess.Popen[str]], T]) -> T:
    process, url = _start(topology, serve_args)
    try:
        asyncio.run(_closed_loop(url, target, 1, 2))  # first-call costs (lazy loads, allocations) stay out
        return work(url, process)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)


def _unbounded_inboxes(topology: Path, out: Path) -> Path:
    """The same topology with every stage's inbox bound too large to matter."""
    document = yaml.safe_load(topology.read_text())
    for stage in document["stages"]:
        stage.setdefault("relay", {})["inbox"] = 1_000_000
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-in-flight", type=int, default=1, help="the operator setting measured first")
    parser.add_argument("--unloaded", type=int, default=40, help="requests measured one at a time first")
    parser.add_argument("--voice", action="store_true", help="the embedded voice assistant instead of a sleep stage")
    parser.add_argument("--voice-concurrency", type=int, default=4, help="closed-loop concurrency measuring its capacity")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.voice:
            target = Target(VOICE_TOPOLOGY, "voice-assistant", text_only=True)
        else:
            topology = Path(tmp) / "overload.yaml"
            topology.write_text(yaml.safe_dump({"name": "overload", "stages": [
                {"name": "answer", "factory": "benchmarks.overload_stages.think", "factory_args": {"seconds": WORK_S},
                 "terminal": True, "modality": "text"}]}))
            target = Target(topology, "overload", text_only=False)

        def baseline(url: str, process: subprocess.Popen[str]) -> tuple[Run, float]:
            unloaded = asyncio.run(_closed_loop(url, target, 1, args.unloaded))
            if not args.voice:
                return unloaded, 1.0 / WORK_S
            busy = asyncio.run(_closed_loop(url, target, args.voice_concurrency, 6 * args.voice_concurrency))
            return unloaded, len(busy.latencies) / busy.seconds

        base, capacity = _serve(target, target.topology, ["--max-in-flight", "0"], baseline)
        rate = 5 * capacity
        runs = []
        for label, topology, serve_args in (
            (f"admission (--max-in-flight {args.max_in_flight})", target.topology, ["--max-in-flight", str(args.max_in_flight)]),
            ("defaults (--max-in-flight 64, inbox 32)", target.topology, []),
            ("off (--max-in-flight 0, no inbox bound)", _unbounded_inboxes(target.topology, Path(tmp) / "off.yaml"),
             ["--max-in-flight", "0"]),
        ):
            runs.append(_serve(target, topology, serve_args, lambda url, process, label=label:
                               asyncio.run(_offer(url, target, rate, args.seconds, Run(label), process))))
    unloaded_p99 = _p(base.latencies, 99)
    what = "voice assistant (text answers)" if args.voice else f"one {WORK_S * 1000:.0f} ms stage"
    table = Table(title=f"overload, {what}: capacity {capacity:.1f} req/s, offered 5x ({rate:.0f} req/s) for "
                        f"{args.seconds:g} s; unloaded p50 {_p(base.latencies, 50) * 1000:.0f} ms, "
                        f"p99 {unloaded_p99 * 1000:.0f} ms")
    for column in ("run", "sent", "completed", "429", "failed", "goodput/s", "p50 ms", "p99 ms", "p99/unloaded",
                   "server p99 ≤ ms", "429 p50 ms", "RSS start MB", "RSS peak MB"):
        table.add_column(column, justify="right")
    for run in runs:
        p99 = _p(run.latencies, 99)
        table.add_row(run.label, str(run.sent), str(len(run.latencies)), str(run.refused), str(run.failed),
                      f"{len(run.latencies) / run.seconds:.1f}", f"{_p(run.latencies, 50) * 1000:.0f}",
                      f"{p99 * 1000:.0f}", f"{p99 / unloaded_p99:.1f}x", f"{run.server_p99 * 1000:.0f}",
                      f"{_p(run.refusal_latencies, 50) * 1000:.0f}", f"{run.rss_start / 2**20:.0f}", f"{run.rss_peak / 2**20:.0f}")
    Console(width=180).print(table)


if __name__ == "__main__":
    main()
