"""The runtime's own per-message cost (issue 14, goal 1), against a raw pyzmq floor, in one run.

(1) latency: a no-op 3-stage pipeline a -> b -> c (a and c in one process, b in another,
    the coordinator in the caller, profiling on: the default), one request at a time,
    against a raw pyzmq ring of the same shape (caller -> P1 -> P2 -> P1 -> caller: four
    PUSH/PULL hops through three processes). Interleaved request by request, with the
    same ring whose relays receive on an asyncio loop as the runtime's processes do (what
    the event loop itself costs). Goal: pipeline p50 <= 2x ring p50.
(2) throughput: the same pipeline, and all three stages in one process, closed loop at
    concurrency 64 (profiling on), interleaved rounds. Goals: >= 3,000 req/s (split), and
    the one-process variant at least as fast as the split one.
(3) streaming: one stage (another process) yields small chunks as fast as it can; the
    caller reads them from ``handle.events()``. Goal: >= 50,000 chunks/s.

Beside each rate: CPU time per request (or chunk), summed over the caller and the stage
processes, the runtime's own cost in a form that the machine's other load hardly changes
(wall-clock rates on a shared 2-core machine swing 2x from one run to the next).

Every figure is the median over ``--runs`` repetitions (each repetition interleaves the
variants, so they see the same machine load). Run: ``python benchmarks/pipeline.py [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # stage processes inherit sys.path: they import this checkout

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

from benchmarks.runtime import pct  # noqa: E402

HERE = "benchmarks.pipeline"
IDENTITY = "omnictl.models.examples.identity"


# --- stage factory (imported by the stage process) -------------------------------------


def chunks() -> Callable[[dict[str, Any]], Iterator[dict[str, Any]]]:
    """Yields ``data["n"]`` small chunks, then a tiny result."""

    def run(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for i in range(int(data["n"])):
            yield {"i": i}
        return {"n": data["n"]}

    return run


# --- the raw ring -------------------------------------------------------------------------


def _serve(pull: Any, forward: Callable[[bytes], bool], on_loop: bool) -> None:
    """Hand every message arriving on ``pull`` to ``forward`` until it returns False:
    blocking receives, or (``on_loop``) from an asyncio loop watching the socket's
    descriptor, as the runtime's processes receive (see omnictl.transports.drain)."""
    import zmq

    if not on_loop:
        while forward(pull.recv()):
            pass
        return

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stopped = loop.create_future()

        def ready() -> None:
            while not stopped.done() and pull.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                if not forward(pull.recv(zmq.NOBLOCK)):
                    stopped.set_result(None)

        loop.add_reader(pull.getsockopt(zmq.FD), ready)
        ready()
        await stopped
        loop.remove_reader(pull.getsockopt(zmq.FD))

    asyncio.run(serve())


def _ring_p1(inbound: str, to_p2: str, to_caller: str, on_loop: bool) -> None:
    """P1: a request from the caller goes on to P2; what P2 sends back goes to the caller."""
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(inbound)
    p2 = context.socket(zmq.PUSH)
    p2.connect(to_p2)
    caller = context.socket(zmq.PUSH)
    caller.connect(to_caller)
    caller.send(b"hello")

    def forward(message: bytes) -> bool:
        if message[:1] == b"a":
            p2.send(b"b" + message[1:])
        elif message[:1] == b"c":
            caller.send(b"d" + message[1:])
        else:
            p2.send(b"x")
            return False
        return True

    _serve(pull, forward, on_loop)
    for socket in (pull, p2, caller):
        socket.close(linger=1000)
    context.term()


def _ring_p2(inbound: str, to_p1: str, on_loop: bool) -> None:
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(inbound)
    p1 = context.socket(zmq.PUSH)
    p1.connect(to_p1)

    def forward(message: bytes) -> bool:
        if message[:1] != b"b":
            return False
        p1.send(b"c" + message[1:])
        return True

    _serve(pull, forward, on_loop)
    pull.close(linger=0)
    p1.close(linger=1000)
    context.term()


class Ring:
    """Four PUSH/PULL hops through three processes: the floor of the 3-stage pipeline.
    ``on_loop``: P1 and P2 receive on an asyncio loop, as the runtime's processes do (the
    caller blocks either way)."""

    def __init__(self, directory: Path, on_loop: bool = False) -> None:
        import zmq

        variant = "loop" if on_loop else "ring"
        p1, p2, caller = (f"ipc://{directory}/{variant}-{name}" for name in ("p1", "p2", "caller"))
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVTIMEO, 60_000)
        self._pull.bind(caller)
        spawn = multiprocessing.get_context("spawn")
        self._processes = [spawn.Process(target=_ring_p2, args=(p2, p1, on_loop), daemon=True),
                           spawn.Process(target=_ring_p1, args=(p1, p2, caller, on_loop), daemon=True)]
        for process in self._processes:
            process.start()
        self._push = self._context.socket(zmq.PUSH)
        self._push.connect(p1)
        self._pull.recv()  # hello from P1

    def once(self, body: bytes) -> float:
        """Seconds for one message around the ring."""
        started = time.perf_counter()
        self._push.send(b"a" + body)
        self._pull.recv()
        return time.perf_counter() - started

    def throughput(self, count: int, concurrency: int, body: bytes) -> float:
        """Messages/s with ``concurrency`` in flight."""
        started = time.perf_counter()
        for _ in range(concurrency):
            self._push.send(b"a" + body)
        for sent in range(concurrency, count + concurrency):
            self._pull.recv()
            if sent < count:
                self._push.send(b"a" + body)
        return count / (time.perf_counter() - started)

    def close(self) -> None:
        self._push.send(b"x")
        for process in self._processes:
            process.join(10)
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._context.term()


# --- pipelines ------------------------------------------------------------------------------


def write_topology(path: Path, stages: list[dict[str, Any]]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"name": path.stem, "stages": stages}, sort_keys=False))
    return path


def three_stages(directory: Path, split: bool) -> Path:
    place = ("p1", "p2", "p1") if split else ("all", "all", "all")
    return write_topology(directory / f"noop3-{'split' if split else 'one'}.yaml", [
        {"name": "a", "factory": IDENTITY, "next": ["b"], "process": place[0]},
        {"name": "b", "factory": IDENTITY, "next": ["c"], "process": place[1]},
        {"name": "c", "factory": IDENTITY, "terminal": True, "process": place[2]},
    ])


async def one(pipe: Any, data: dict[str, Any], request_id: str | None = None) -> float:
    started = time.perf_counter()
    await (await pipe.submit(data, request_id=request_id)).result()
    return time.perf_counter() - started


SEGMENTS = (
    ("caller -> a (Submit hop)", ("admitted", None), ("input_received", "a")),
    ("a: input -> result", ("input_received", "a"), ("stage_done", "a")),
    ("a -> b (shm hop)", ("stage_done", "a"), ("input_received", "b")),
    ("b: input -> result", ("input_received", "b"), ("stage_done", "b")),
    ("b -> c (shm hop)", ("stage_done", "b"), ("input_received", "c")),
    ("c: input -> result", ("input_received", "c"), ("stage_done", "c")),
    ("c -> caller (terminal output)", ("stage_done", "c"), ("terminal_complete", "c")),
    ("caller: terminal output -> completed", ("terminal_complete", "c"), ("completed", None)),
)


def breakdown(pipe: Any, request_ids: set[str]) -> dict[str, float]:
    """Median seconds per segment of a request's path, from the profiler's timestamps
    (one clock: every process is on this machine)."""
    marks: dict[str, dict[tuple[str, str | None], int]] = {rid: {} for rid in request_ids}
    for event in pipe.profile.store.iter_events():
        if event.request_id in marks:
            marks[event.request_id].setdefault((event.kind.value, event.stage), event.ts)
    result = {}
    for label, start, end in SEGMENTS:
        spans = [m[end] - m[start] for m in marks.values() if start in m and end in m]
        result[label] = statistics.median(spans) / 1e9 if spans else float("nan")
    return result


async def closed_loop(pipe: Any, requests: int, concurrency: int) -> float:
    remaining = iter(range(requests))

    async def client() -> None:
        for i in remaining:
            await (await pipe.submit({"text": f"request {i}"})).result()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started)


async def stream_rate(pipe: Any, n: int) -> float:
    from omnictl.coordinator.request import RequestEventKind

    started = time.perf_counter()
    handle = await pipe.submit({"n": n})
    seen = 0
    async for event in handle.events():
        if event.kind is RequestEventKind.STREAM:
            seen += 1
    elapsed = time.perf_counter() - started
    assert seen == n, (seen, n)
    return n / elapsed


def cpu_seconds(pipe: Any) -> float:
    """CPU time (user + system) used so far by this process and the pipeline's processes:
    the runtime's cost in a form the machine's other load hardly changes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = sum(os.times()[:2])
    for pid in pipe.process_ids().values():
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


async def measured(pipe: Any, work: Any, units: int) -> tuple[float, float]:
    """(the awaited rate, CPU µs per unit over the caller and the pipeline's processes)."""
    before = cpu_seconds(pipe)
    rate = await work
    return rate, (cpu_seconds(pipe) - before) / units * 1e6


async def run_all(directory: Path, quick: bool, runs: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    import omnictl

    sequential = 100 if quick else 400
    requests_64 = 600 if quick else 2000
    chunk_count = 5000 if quick else 20000
    body = bytes(120)  # about a small DataReady
    figures: dict[str, list[float]] = {key: [] for key in (
        "pipeline p50", "ring p50", "asyncio ring p50", "pipeline p99", "ring p99", "split c=64", "one process c=64", "ring c=64",
        "stream chunks/s", "split CPU/request", "one process CPU/request", "stream CPU/chunk")}
    ring = Ring(directory)
    loop_ring = Ring(directory, on_loop=True)
    try:
        async with contextlib.AsyncExitStack() as stack:
            launch = lambda path, label: stack.enter_async_context(  # noqa: E731
                omnictl.Pipeline.launch(path, device="cpu", profile=True, run_dir=directory / f"run-{label}",
                                        max_in_flight=None))
            split = await launch(three_stages(directory, True), "split")
            together = await launch(three_stages(directory, False), "one")
            streamer = await launch(write_topology(directory / "stream.yaml", [
                {"name": "gen", "factory": f"{HERE}.chunks", "terminal": True}]), "stream")
            for pipe in (split, together):  # warm up
                await closed_loop(pipe, 200, 16)
            await stream_rate(streamer, 500)
            sequential_ids: set[str] = set()
            for _ in range(runs):
                pipeline_latencies, ring_latencies, loop_ring_latencies = [], [], []
                for i in range(sequential):
                    rid = f"seq-{len(figures['pipeline p50'])}-{i}"
                    sequential_ids.add(rid)
                    pipeline_latencies.append(await one(split, {"text": f"request {i}"}, rid))
                    ring_latencies.append(ring.once(body))
                    loop_ring_latencies.append(loop_ring.once(body))
                figures["pipeline p50"].append(pct(pipeline_latencies, 50))
                figures["ring p50"].append(pct(ring_latencies, 50))
                figures["asyncio ring p50"].append(pct(loop_ring_latencies, 50))
                figures["pipeline p99"].append(pct(pipeline_latencies, 99))
                figures["ring p99"].append(pct(ring_latencies, 99))
                for pipe, label in ((split, "split"), (together, "one process")):
                    rate, cpu = await measured(pipe, closed_loop(pipe, requests_64, 64), requests_64)
                    figures[f"{label} c=64"].append(rate)
                    figures[f"{label} CPU/request"].append(cpu)
                figures["ring c=64"].append(ring.throughput(requests_64, 64, body))
                rate, cpu = await measured(streamer, stream_rate(streamer, chunk_count), chunk_count)
                figures["stream chunks/s"].append(rate)
                figures["stream CPU/chunk"].append(cpu)
            await asyncio.sleep(0.5)  # the stage recorders ship every 50 ms
            segments = breakdown(split, sequential_ids)
    finally:
        ring.close()
        loop_ring.close()
    return figures, segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke test)")
    parser.add_argument("--runs", type=int, default=None, help="repetitions (default 3, quick 1)")
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"omnictl pipeline benchmark, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
                  f"{runs} run(s), variants interleaved")
    with tempfile.TemporaryDirectory(prefix="omx-pipe-") as tmp:
        figures, segments = asyncio.run(run_all(Path(tmp), args.quick, runs))
    med = {key: statistics.median(values) for key, values in figures.items()}

    table = Table(title="figures (median of runs; per run in brackets)")
    table.add_column("measure")
    table.add_column("median", justify="right")
    table.add_column("runs", justify="right")
    for key, values in figures.items():
        if key.endswith(("p50", "p99")):
            fmt: Callable[[float], str] = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
        elif "CPU" in key:
            fmt = lambda v: f"{v:,.0f} µs"  # noqa: E731
        else:
            fmt = lambda v: f"{v:,.0f}/s"  # noqa: E731
        table.add_row(key, fmt(med[key]), " ".join(fmt(v) for v in values))
    console.print(table)

    where = Table(title="where a sequential request's time goes (split pipeline, profiler timestamps, median per segment)")
    where.add_column("segment")
    where.add_column("median", justify="right")
    for label, seconds in segments.items():
        where.add_row(label, f"{seconds * 1e6:,.0f} µs")
    where.add_row("sum of segments (admitted -> completed)", f"{sum(segments.values()) * 1e6:,.0f} µs")
    where.add_row("raw ring, one message around (p50, for scale)", f"{med['ring p50'] * 1e6:,.0f} µs")
    where.add_row("the same ring, relays on an asyncio loop (p50)", f"{med['asyncio ring p50'] * 1e6:,.0f} µs")
    console.print(where)

    ratio = med["pipeline p50"] / med["ring p50"]
    goals = Table(title="issue 14, goal 1")
    for column in ("goal", "measured", "met"):
        goals.add_column(column)
    rows = [
        ("no-op 3 stages p50 <= 2x raw ring (profiling on)",
         f"{ratio:.2f}x ({med['pipeline p50'] * 1e3:.2f} vs {med['ring p50'] * 1e3:.2f} ms)", ratio <= 2.0),
        (">= 3,000 req/s at concurrency 64 (split)", f"{med['split c=64']:,.0f} req/s", med["split c=64"] >= 3000),
        ("one process >= split at c=64", f"{med['one process c=64']:,.0f} vs {med['split c=64']:,.0f} req/s",
         med["one process c=64"] >= med["split c=64"]),
        (">= 50,000 stream chunks/s to the caller", f"{med['stream chunks/s']:,.0f} chunks/s",
         med["stream chunks/s"] >= 50_000),
    ]
    for name, measured, met in rows:
        goals.add_row(name, measured, "met" if met else "not met")
    console.print(goals)
    console.print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
