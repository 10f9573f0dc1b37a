"""Stage replicas: throughput of a pipeline whose slow stage runs as 1, 2 or 4 replicas.

In one run, side by side:

- **synthetic**: a 3-stage pipeline (``front`` -> ``mid`` -> ``back``, one process each)
  whose middle stage waits a fixed 20 ms per request with the GIL released (standing in
  for an accelerator kernel), with ``processes: {mid: {replicas: N}}`` for N = 1, 2, 4;
  closed loop at concurrency 32. Goal: 4 replicas >= 3.5x the requests/s of 1.
- **voice assistant** (``--voice``): the embedded voice assistant with its ``speech``
  process (the ``tts`` stage) at 1 and 2 replicas, closed loop at concurrency 4 over the
  spoken samples. On a 2-core machine expect little: every stage competes for the cores.

Reported per setting: requests/s, speedup over 1 replica, p50 and p99 latency.
Profiling is off (the runtime alone is measured).

Run: ``python benchmarks/replicas.py [--requests 600] [--voice] [--voice-requests 8]``
"""

from __future__ import annotations

import sys

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.pipeline import Pipeline
from omnictl.profiling.units import format_seconds

E = "omnictl.models.examples"
VOICE = Path(__file__).resolve().parents[1] / "topologies" / "voice-assistant.yaml"
GOAL = 3.5


@dataclass
class Run:
    label: str
    replicas: int
    requests: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def synthetic_topology(directory: Path, replicas: int, wait_s: float) -> Path:
    stages = [
        {"name": "front", "factory": f"{E}.identity", "next": ["mid"]},
        {"name": "mid", "factory": f"{E}.sleep", "factory_args": {"seconds": wait_s}, "next": ["back"]},
        {"name": "back", "factory": f"{E}.identity", "terminal": True},
    ]
    path = directory / f"replicas-{replicas}.yaml"
    document = {"name": f"mid-x{replicas}", "stages": stages, "processes": {"mid": {"replicas": replicas}}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def voice_topology(directory: Path, replicas: int) -> Path:
    document = yaml.safe_load(VOICE.read_text())
    document["processes"] = {"speech": {"replicas": replicas}}
    path = directory / f"voice-{replicas}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


async def closed_loop(pipe: Any, make_input: Callable[[int], Any], concurrency: int, total: int,
                      warmup: int) -> tuple[int, float, list[float]]:
    """``concurrency`` clients, each submitting its next request when the last one ends,
    until ``total`` requests finished; the first ``warmup`` are not timed."""
    counter = iter(range(total + warmup))
    latencies: list[float] = []
    started: list[float] = []

    async def client() -> None:
        for i in counter:
            if i == warmup:
                started.append(time.perf_counter())
            begin = time.perf_counter()
            await (await pipe.submit(make_input(i))).result()
            if i >= warmup:
                latencies.append(time.perf_counter() - begin)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return len(latencies), time.perf_counter() - started[0], latencies


async def measure(label: str, path: Path, replicas: int, make_input: Callable[[int], Any],
                  concurrency: int, total: int, warmup: int) -> Run:
    async with Pipeline.launch(path, profile=False, request_timeout=600.0, ready_timeout=600.0) as pipe:
        count, seconds, latencies = await closed_loop(pipe, make_input, concurrency, total, warmup)
    return Run(label, replicas, count, seconds, latencies)


def table(title: str, runs: list[Run], concurrency: int) -> Table:
    out = Table(title=f"{title} (closed loop, concurrency {concurrency})", title_justify="left")
    for column in ("replicas", "requests", "requests/s", "vs 1 replica", "p50", "p99"):
        out.add_column(column, justify="right")
    base = runs[0].rate
    for run in runs:
        out.add_row(str(run.replicas), str(run.requests), f"{run.rate:.1f}" if run.rate >= 10 else f"{run.rate:.3f}",
                    f"{run.rate / base:.2f}x", format_seconds(run.quantile(0.5)), format_seconds(run.quantile(0.99)))
    return out


async def main(args: argparse.Namespace) -> None:
    console = Console()
    with tempfile.TemporaryDirectory(prefix="omnictl-replicas-") as tmp:
        directory = Path(tmp)
        runs = []
        for replicas in (1, 2, 4):
            path = synthetic_topology(directory, replicas, args.wait_ms / 1000)
            runs.append(await measure("synthetic", path, replicas, lambda i: {"i": i}, args.concurrency,
                                      args.requests, warmup=args.concurrency))
            console.print(f"synthetic, {replicas} replica(s): {runs[-1].rate:.1f} requests/s", style="dim")
        console.print(table(f"synthetic: middle stage waits {args.wait_ms:g} ms (GIL released)", runs,
                            args.concurrency))
        speedup = runs[-1].rate / runs[0].rate
        ideal = 1000 / args.wait_ms
        console.print(f"4 replicas: {speedup:.2f}x the throughput of 1 (goal >= {GOAL}x: "
                      f"{'met' if speedup >= GOAL else 'NOT met'}); one replica's ceiling is "
                      f"{ideal:.0f} requests/s")
        if args.voice:
            from benchmarks.eval.samples import sample_names, sample_request

            names = sample_names()

            def question(i: int) -> Any:
                return sample_request(names[i % len(names)],
                                      sampling={"max_tokens": args.max_tokens, "temperature": 0})

            voice_runs = []
            for replicas in (1, 2):
                voice_runs.append(await measure("voice", voice_topology(directory, replicas), replicas, question,
                                                args.voice_concurrency, args.voice_requests,
                                                warmup=args.voice_concurrency))
                console.print(f"voice assistant, tts x{replicas}: {voice_runs[-1].rate:.2f} requests/s",
                              style="dim")
            console.print(table(f"voice assistant: `speech` process (tts), max_tokens {args.max_tokens}",
                                voice_runs, args.voice_concurrency))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="timed requests per synthetic setting")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--wait-ms", type=float, default=20.0)
    parser.add_argument("--voice", action="store_true", help="also run the embedded voice assistant")
    parser.add_argument("--voice-requests", type=int, default=8)
    parser.add_argument("--voice-concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    asyncio.run(main(parser.parse_args()))
