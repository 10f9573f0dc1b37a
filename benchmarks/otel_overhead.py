"""What OpenTelemetry export costs, side by side in one run.

A no-op 3-stage pipeline (three processes, shared-memory hops; profiling on, as ``serve``
runs it), driven in closed loop through ``Pipeline.submit`` with a ``traceparent`` on every
request, three ways:

* ``off``          no OTLP endpoint (the default)
* ``on``           exporting to an OTLP/HTTP receiver (a process of its own, decoding every
                   body with opentelemetry-proto and counting the requests' root spans)
* ``unreachable``  an endpoint where nothing listens: serving must not slow down or block

Per way: requests per second (launch excluded), CPU ms per request summed over the
coordinator's process, every stage process and the profiling collector's (where the spans
are built), and for ``on`` how many of the requests' traces the receiver got. Interleaved
rounds, median of each.

Then what one trace costs the collector's process, measured on requests the ``on`` rounds
recorded: building the spans (``build_trace`` + the SDK's spans) and encoding them for
OTLP, in CPU µs per request; one core turns that into at most 1e6 / µs traces per second.
Past that rate, the bounded backlog drops traces (counted, one warning) and serving goes on.

Run: ``python benchmarks/otel_overhead.py [--requests 400] [--concurrency 8] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: its sibling modules import as benchmarks.*
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profiling_overhead import NOOP_TOPOLOGY  # the no-op pipeline the profiler is measured on

_WARMUP = 20  # requests before measuring: first-request costs (imports, caches) excluded
_CATCH_UP_S = 3.0  # after the measured requests, before closing the pipeline
_SETTLE_S = 8.0  # how long to wait for the last traces after a round (grace 1 s + batch delay 1 s)
WAYS = ("off", "on", "unreachable")


def receive(port: "Synchronized[int]", roots: "Synchronized[int]") -> None:
    """An OTLP/HTTP receiver: decode every POST /v1/traces, count the root spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (the stdlib's name)
            request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["content-length"])))
            found = sum(1 for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
                        if span.name == "omnictl.request")
            with roots.get_lock():
                roots.value += found
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port.value = server.server_address[1]
    server.serve_forever()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (Linux /proc; 10 ms ticks per process)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


async def pipeline_round(topology: Path, run_dir: Path, endpoint: str | None, requests: int,
                         concurrency: int) -> tuple[float, float]:
    """Requests per second (launch excluded), and CPU ms per request over every process of the pipeline."""
    from omnictl.pipeline import Pipeline

    async with Pipeline.launch(topology, device="cpu", run_dir=run_dir, otlp_endpoint=endpoint) as pipe:
        async def worker(offset: int, count: int) -> None:
            for index in range(offset, count, concurrency):
                traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
                handle = await pipe.submit({"text": f"request {index}"}, traceparent=traceparent)
                await handle.result()

        await asyncio.gather(*(worker(w, _WARMUP) for w in range(concurrency)))
        pids = [os.getpid(), *pipe.process_ids().values()]
        if pipe.profile is not None and pipe.profile.pid not in pids:
            pids.append(pipe.profile.pid)  # the collector's process: where the spans are built
        cpu_before, started = cpu_seconds(pids), time.perf_counter()
        await asyncio.gather(*(worker(w, requests) for w in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pids) - cpu_before
        # A server goes on after a burst: give the export the time to catch up before shutting
        # down (whose flush is bounded, and would drop what is left).
        await asyncio.sleep(_CATCH_UP_S)
        return requests / elapsed, cpu / requests * 1000


def trace_cost(run_dir: Path, count: int = 300) -> tuple[float, float, float]:
    """CPU µs per request to build its spans and to encode them, and spans per request, over
    ``count`` requests recorded in ``run_dir``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from omnictl.profiling.store import TraceStore
    from omnictl.telemetry.spans import emit_trace

    store = TraceStore(run_dir)
    events: dict[str, list[Any]] = {}
    for event in store.iter_events():
        events.setdefault(event.request_id, []).append(event)
    finished = [rid for rid, evs in events.items() if rid and any(e.kind.value == "completed" for e in evs)][:count]
    memory = InMemorySpanExporter()
    provider, processor = TracerProvider(), SimpleSpanProcessor(memory)
    started = time.thread_time_ns()
    for rid in finished:
        emit_trace(provider, processor, rid, events[rid], {"c": "text"})
    built = time.thread_time_ns()
    spans = memory.get_finished_spans()
    encode_spans(spans).SerializePartialToString()
    encoded = time.thread_time_ns()
    return (built - started) / len(finished) / 1000, (encoded - built) / len(finished) / 1000, len(spans) / len(finished)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three ways")
    args = parser.parse_args()

    context = multiprocessing.get_context("spawn")
    port, roots = context.Value("i", 0), context.Value("i", 0)
    receiver = context.Process(target=receive, args=(port, roots), daemon=True)
    receiver.start()
    while not port.value:
        time.sleep(0.01)
    endpoints = {"off": None, "on": f"http://127.0.0.1:{port.value}", "unreachable": f"http://127.0.0.1:{closed_port()}"}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work skews every figure below)")
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    exported: list[float] = []
    costs: tuple[float, float, float] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="omnictl-bench-") as tmp:
            topology = Path(tmp) / "noop.yaml"
            topology.write_text(NOOP_TOPOLOGY)
            for round_index in range(args.rounds):
                order = WAYS[round_index % 3:] + WAYS[:round_index % 3]  # each way goes first once in 3 rounds
                for way in order:
                    before = roots.value
                    rate, cpu_ms = asyncio.run(pipeline_round(topology, Path(tmp) / f"run-{round_index}-{way}",
                                                              endpoints[way], args.requests, args.concurrency))
                    rates[way].append(rate)
                    cpu[way].append(cpu_ms)
                    line = f"  round {round_index + 1}: {way:<11} {rate:8.1f} req/s  {cpu_ms:.3f} CPU ms/request"
                    if way == "on":
                        deadline = time.monotonic() + _SETTLE_S  # close() flushed; late posts may still land
                        while roots.value - before < args.requests + _WARMUP and time.monotonic() < deadline:
                            time.sleep(0.1)
                        got = roots.value - before
                        exported.append(got / (args.requests + _WARMUP))
                        line += f"  {got}/{args.requests + _WARMUP} traces received"
                    print(line, flush=True)
            costs = trace_cost(Path(tmp) / "run-0-on")
    finally:
        receiver.kill()
    off_rate, off_cpu = statistics.median(rates["off"]), statistics.median(cpu["off"])
    print(f"no-op 3-stage pipeline, {args.requests} requests at concurrency {args.concurrency}, "
          f"median of {args.rounds} interleaved rounds:")
    print(f"  {'way':<12}{'req/s':>9}{'vs off':>9}{'CPU ms/req':>12}{'vs off':>9}  traces received")
    for way in WAYS:
        rate, cpu_ms = statistics.median(rates[way]), statistics.median(cpu[way])
        received = f"{min(exported):.0%} (worst round)" if way == "on" else "-"
        print(f"  {way:<12}{rate:>9.1f}{rate / off_rate:>9.1%}{cpu_ms:>12.3f}{(cpu_ms - off_cpu) / off_cpu:>+9.1%}  {received}")
    if costs is not None:
        build_us, encode_us, spans = costs
        print(f"one trace ({spans:.1f} spans, recorded by the 'on' rounds): build {build_us:.0f} µs + encode {encode_us:.0f} µs "
              f"CPU = {build_us + encode_us:.0f} µs: one core exports at most {1e6 / (build_us + encode_us):,.0f} traces/s")


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main()
