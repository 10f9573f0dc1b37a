"""What profiling costs.

1. ``Recorder.record``: nanoseconds per event, with a collector listening and with none
   (a dead collector must not make recording slower or blocking).
2. The collector: events per second it stores and aggregates.
3. A no-op 3-stage pipeline (three processes, shared-memory hops): requests per second
   with profiling off and on, interleaved rounds, median of each. Target: on stays within
   10% of off.

Run: ``python benchmarks/profiling_overhead.py [--requests 400] [--concurrency 8] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from omnictl.profiling.collector import Collector
from omnictl.profiling.events import EventKind
from omnictl.profiling.recorder import Recorder
from omnictl.profiling.synthetic import synthetic_request


def record_cost(address: str, events: int) -> float:
    """ns per ``record`` call (shipping thread running, buffer large enough to keep all)."""
    recorder = Recorder("bench", address, capacity=events + 1, flush_interval=0.05)
    started = time.perf_counter_ns()
    for index in range(events):
        recorder.record(EventKind.HOP_SENT, "req-1234", "thinker", target="talker", bytes=index, transport="shm")
    elapsed = time.perf_counter_ns() - started
    recorder.close(timeout=1.0)
    return elapsed / events


def collector_throughput(directory: Path, requests: int) -> float:
    """Events per second the collector decodes, stores and aggregates."""
    address = f"ipc://{directory}/collector.sock"
    batches = [synthetic_request(f"r{i}") for i in range(requests)]
    total = sum(len(batch) for batch in batches)
    with Collector(directory / "run", address) as collector:
        recorder = Recorder("bench", address, capacity=total + 1, flush_interval=3600)
        for batch in batches:
            for event in batch:
                recorder.record(event.kind, event.request_id, event.stage, **event.meta)
        started = time.perf_counter()
        recorder.flush()
        if not collector.wait_for(total, timeout=120):
            raise RuntimeError(f"collector received {collector.received} of {total} events")
        elapsed = time.perf_counter() - started
        recorder.close()
    return total / elapsed


def noop_topology(directory: Path) -> Path:
    stages = [
        {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"]},
        {"name": "b", "factory": "omnictl.models.examples.identity", "next": ["c"]},
        {"name": "c", "factory": "omnictl.models.examples.identity", "terminal": True},
    ]
    path = directory / "noop.yaml"
    path.write_text(yaml.safe_dump({"name": "noop", "stages": stages}, sort_keys=False))
    return path


async def pipeline_rate(topology: Path, run_dir: Path, profile: bool, requests: int, concurrency: int) -> float:
    """Requests per second through the pipeline (launch excluded)."""
    import omnictl

    async with omnictl.Pipeline.launch(topology, device="cpu", run_dir=run_dir, profile=profile) as pipe:
        async def one(index: int) -> None:
            handle = await pipe.submit({"text": f"request {index}"})
            await handle.result()

        async def worker(offset: int, count: int) -> None:
            for index in range(offset, count, concurrency):
                await one(index)

        await asyncio.gather(*(worker(w, 20) for w in range(concurrency)))  # warm up
        started = time.perf_counter()
        await asyncio.gather(*(worker(w, requests) for w in range(concurrency)))
        return requests / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events for the record() micro-benchmark")
    parser.add_argument("--requests", type=int, default=400, help="requests per pipeline round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved off/on rounds")
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="omnictl-bench-") as tmp:
        directory = Path(tmp)
        with Collector(directory / "micro", f"ipc://{directory}/live.sock"):
            live = record_cost(f"ipc://{directory}/live.sock", args.events)
        dead = record_cost(f"ipc://{directory}/nobody.sock", args.events)
        print(f"record(): {live:.0f} ns/event with a collector, {dead:.0f} ns/event with none listening")
        print(f"collector: {collector_throughput(directory, 2000):,.0f} events/s decoded, stored and aggregated")
        if args.skip_pipeline:
            return
        topology = noop_topology(directory)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for round_index in range(args.rounds):
            for profile in (False, True):
                run_dir = directory / f"run-{round_index}-{profile}"
                rate = asyncio.run(pipeline_rate(topology, run_dir, profile, args.requests, args.concurrency))
                rates[profile].append(rate)
                print(f"  round {round_index + 1}: profiling {'on ' if profile else 'off'} {rate:8.1f} req/s")
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        print(
            f"no-op 3-stage pipeline ({args.requests} requests, concurrency {args.concurrency}, "
            f"median of {args.rounds}): off {off:.1f} req/s, on {on:.1f} req/s, "
            f"on/off = {on / off:.1%} ({(on - off) / off:+.1%})"
        )


if __name__ == "__main__":
    main()
