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
import os
import statistics
import tempfile
import time
from pathlib import Path


from omnictl.profiling.collector import Collector
from omnictl.profiling.events import EventKind
from omnictl.profiling.recorder import Recorder
from omnictl.profiling.store import TraceStore
from tests.support.synthetic import synthetic_request

_WARMUP = 20  # requests before measuring: first-request costs (imports, caches) excluded


def record_cost(directory: Path, events: int) -> tuple[float, float]:
    """CPU ns per ``record`` call, and per event to encode and ship a batch (to no one)."""
    recorder = Recorder("bench", f"ipc://{directory}/nobody.sock", capacity=events + 1, flush_interval=3600)
    started = time.thread_time_ns()
    for index in range(events):
        recorder.record(EventKind.HOP_SENT, "req-1234", "thinker", target="talker", bytes=index, transport="shm")
    recorded = time.thread_time_ns()
    recorder.flush()
    shipped = time.thread_time_ns()
    recorder.close(timeout=0)
    return (recorded - started) / events, (shipped - recorded) / events


def collector_cost(directory: Path, requests: int) -> tuple[float, float]:
    """Events per second the collector process decodes, stores and aggregates (wall), and
    its CPU microseconds per event."""
    address = f"ipc://{directory}/collector.sock"
    batches = [synthetic_request(f"r{i}") for i in range(requests)]
    total = sum(len(batch) for batch in batches)
    with Collector(directory / "run", address) as collector:
        recorder = Recorder("bench", address, capacity=total + 1, flush_interval=3600)
        for batch in batches:
            for event in batch:
                recorder.record(event.kind, event.request_id, event.stage, **event.meta)
        cpu_before, started = cpu_seconds([collector.pid]), time.perf_counter()
        recorder.flush()
        if not collector.wait_for(total, timeout=120):
            raise RuntimeError(f"collector received {collector.received} of {total} events")
        elapsed, cpu = time.perf_counter() - started, cpu_seconds([collector.pid]) - cpu_before
        recorder.close()
    return total / elapsed, cpu / total * 1e6


NOOP_TOPOLOGY = """\
name: noop
stages:
  - name: a
    factory: omnictl.models.examples.identity
    next: [b]
  - name: b
    factory: omnictl.models.examples.identity
    next: [c]
  - name: c
    factory: omnictl.models.examples.identity
    terminal: true
"""


def noop_topology(directory: Path) -> Path:
    """Three identity stages, one process each (so every hop crosses processes via shm)."""
    path = directory / "noop.yaml"
    path.write_text(NOOP_TOPOLOGY)
    return path


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (Linux /proc; 10 ms ticks per process)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


async def pipeline_round(
    topology: Path, run_dir: Path, profile: bool, requests: int, concurrency: int
) -> tuple[float, float]:
    """Requests per second through the pipeline (launch excluded), and CPU ms per request
    summed over the coordinator's process, every stage process and the collector's."""
    from omnictl.pipeline import Pipeline

    async with Pipeline.launch(topology, device="cpu", run_dir=run_dir, profile=profile) as pipe:
        async def worker(offset: int, count: int) -> None:
            for index in range(offset, count, concurrency):
                handle = await pipe.submit({"text": f"request {index}"})
                await handle.result()

        await asyncio.gather(*(worker(w, _WARMUP) for w in range(concurrency)))
        pids = [os.getpid(), *pipe.process_ids().values()]
        if pipe.profile is not None and pipe.profile.pid not in pids:
            pids.append(pipe.profile.pid)  # the collector's own process
        cpu_before, started = cpu_seconds(pids), time.perf_counter()
        await asyncio.gather(*(worker(w, requests) for w in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pids) - cpu_before
        return requests / elapsed, cpu / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events for the record() micro-benchmark")
    parser.add_argument("--requests", type=int, default=400, help="requests per pipeline round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved off/on rounds")
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work skews every figure below)")
    with tempfile.TemporaryDirectory(prefix="omnictl-bench-") as tmp:
        directory = Path(tmp)
        record_ns, ship_ns = record_cost(directory, args.events)
        print(f"record(): {record_ns:.0f} ns/event; encoding and shipping: {ship_ns:.0f} ns/event (CPU time)")
        rate, collector_us = collector_cost(directory, 3000)
        print(f"collector process: {rate:,.0f} events/s decoded, stored and aggregated; {collector_us:.2f} CPU µs/event")
        if args.skip_pipeline:
            return
        topology = noop_topology(directory)
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for round_index in range(args.rounds):
            # Alternate which goes first, so neither always gets the warmer machine.
            for profile in (False, True) if round_index % 2 == 0 else (True, False):
                run_dir = directory / f"run-{round_index}-{profile}"
                rate, cpu_ms = asyncio.run(pipeline_round(topology, run_dir, profile, args.requests, args.concurrency))
                rates[profile].append(rate)
                cpu[profile].append(cpu_ms)
                print(f"  round {round_index + 1}: profiling {'on ' if profile else 'off'} {rate:8.1f} req/s  {cpu_ms:.3f} CPU ms/request")
        recorded = sum(1 for _ in TraceStore(directory / "run-0-True").iter_events())
        per_request = recorded / (args.requests + _WARMUP)
        profiling_ms = per_request * (record_ns + ship_ns + collector_us * 1000) / 1e6
        print(
            f"  {per_request:.1f} events recorded per request: profiling CPU ≈ {per_request:.1f} × "
            f"({record_ns:.0f} + {ship_ns:.0f} + {collector_us * 1000:.0f}) ns = {profiling_ms:.3f} ms/request"
        )
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        cpu_off, cpu_on = statistics.median(cpu[False]), statistics.median(cpu[True])
        print(
            f"no-op 3-stage pipeline ({args.requests} requests, concurrency {args.concurrency}, "
            f"median of {args.rounds} interleaved rounds):\n"
            f"  throughput  off {off:.1f} req/s, on {on:.1f} req/s: on/off = {on / off:.1%}\n"
            f"  CPU         off {cpu_off:.3f} ms/request, on {cpu_on:.3f} ms/request: {(cpu_on - cpu_off) / cpu_off:+.1%}\n"
            f"  bottom-up   profiling adds {profiling_ms:.3f} CPU ms to {cpu_off:.3f}: {profiling_ms / cpu_off:+.1%} "
            f"(throughput bound by CPU: on/off ≈ {cpu_off / (cpu_off + profiling_ms):.1%})"
        )


if __name__ == "__main__":
    main()
