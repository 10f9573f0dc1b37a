"""What the runtime itself costs, measured side by side against raw floors in one run.

(a) hop latency per transport (``inproc``: two stages in one process; ``shm``: two
    processes), from the profiler's HOP_SENT -> HOP_RECEIVED timestamps, against a raw
    pyzmq PUSH/PULL one-way message between two processes. Goal: shm hop p50 <= 2x raw.
(b) 4 MiB and 64 MiB float32 tensors through the real shm codec (PayloadCodec encode in
    process A, control message over zmq, decode into views in process B, release sent back
    when B frees them) against a plain shared-memory copy between two processes (see
    ``benchmarks/shm.py`` for the transfer against its floors, goal 2 of issue 14). Goal: shm >= 60% of the raw GB/s.
    Plus the inproc hop latency in a real pipeline for 1 KiB, 1 MiB, 64 MiB payloads
    (must be flat: nothing is copied).
(c) no-op pipelines of 3 and 8 stages (one process per stage, and all in one process):
    requests/s and p50 latency at concurrency 1, 16, 64 (closed loop, profiling off).
    Goal: >= 1,000 req/s through the 3-stage pipeline at concurrency 64.
(d) the text-only path: a thinker whose result carries token ids plus a 512x2048 float32
    hidden state feeding a ``decode`` terminal, co-located with a projection dropping the
    hidden state vs. decode in another process without projection (hidden through shm).
    The article reports 33% lower latency.

Run: ``python benchmarks/runtime.py [--quick]`` (quick: under a minute, for smoke tests).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # stage processes inherit sys.path: benchmarks.runtime imports there

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.peer import Peer, PeerSide, serve  # noqa: E402

KiB = 1024
MiB = 1024 * 1024
HERE = "benchmarks.runtime"  # stage factories below, as topologies name them


# --- stage factories (imported by the stage processes) ---------------------------------


def tensor_source() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Returns ``{"x": <float32 array of data["nbytes"] bytes>}``; arrays are made once
    (and touched) per size, so the stage itself costs nothing."""
    cache: dict[int, np.ndarray] = {}

    def run(data: dict[str, Any]) -> dict[str, Any]:
        nbytes = int(data["nbytes"])
        arr = cache.get(nbytes)
        if arr is None:
            arr = cache[nbytes] = np.ones(nbytes // 4, dtype=np.float32)
        return {"x": arr, "nbytes": nbytes}

    return run


def tensor_sink() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Drops the tensor: the terminal output to the coordinator stays tiny."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {"nbytes": int(data["x"].nbytes)}

    return run


def thinker(tokens: int = 64, rows: int = 512, cols: int = 2048) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A stand-in thinker: token ids plus a large hidden-state tensor (made once)."""
    import torch

    ids = torch.arange(1000, 1000 + tokens, dtype=torch.int64)
    hidden = torch.randn(rows, cols, dtype=torch.float32)

    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {"ids": ids, "hidden": hidden}

    return run


def detokenize() -> Callable[[dict[str, Any]], Any]:
    from omnictl.outputs import TextResult  # a text terminal's result is typed (the output contract)

    def run(data: dict[str, Any]) -> TextResult:
        return TextResult(text=" ".join(str(i) for i in data["ids"].tolist()))

    return run


# --- helpers -------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[index]


def us(ns: float) -> str:
    return f"{ns / 1e3:,.1f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def write_topology(directory: Path, name: str, stages: list[dict[str, Any]]) -> Path:
    import yaml

    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "stages": stages}, sort_keys=False))
    return path


def hop_latencies(pipe: Any, src: str, dst: str, request_ids: set[str]) -> dict[str, int]:
    """request id -> HOP_RECEIVED.ts - HOP_SENT.ts (ns) for the src -> dst edge."""
    from omnictl.profiling.events import EventKind

    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    for event in pipe.profile.store.iter_events():
        if event.request_id not in request_ids:
            continue
        if event.kind == EventKind.HOP_SENT and event.stage == src and event.meta.get("target") == dst:
            sent[event.request_id] = event.ts
        elif event.kind == EventKind.HOP_RECEIVED and event.stage == dst and event.meta.get("source") == src:
            received[event.request_id] = event.ts
    return {rid: received[rid] - sent[rid] for rid in sent if rid in received}


async def closed_loop(
    pipe: Any, inputs: Callable[[int], dict[str, Any]], requests: int, concurrency: int, prefix: str
) -> tuple[float, list[float], list[str]]:
    """Requests/s, per-request latencies (s) and the request ids, ``concurrency`` clients
    each submitting its next request as soon as the previous one finished."""
    indices = iter(range(requests))
    latencies: list[float] = []
    ids: list[str] = []

    async def client() -> None:
        for index in indices:  # shared: every client takes the next index
            rid = f"{prefix}-{index}"
            started = time.perf_counter()
            handle = await pipe.submit(inputs(index), request_id=rid)
            await handle.result()
            latencies.append(time.perf_counter() - started)
            ids.append(rid)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started), latencies, ids


async def flush_profile() -> None:
    """Give the stage recorders (50 ms flush interval) time to ship the last events."""
    await asyncio.sleep(0.3)


# --- raw floors: a second process -------------------------------------------------------

# Requests to the peer (benchmarks/peer.py): it answers each with [one-way ns, ShmRef | None].
_PING, _CODEC, _RAWSHM = b"p", b"c", b"r"


def _answer(side: PeerSide, kind: bytes, sent: int, body: bytes) -> list[Any]:
    if kind == _PING:
        return [time.time_ns() - sent, None]
    if kind == _CODEC:
        # as a stage process receives: views of the slot, released when freed (at once here)
        data = side.leases.decode(side.payloads.decode(body))
        dt = time.time_ns() - sent
        del data
        return [dt, side.released.pop() if side.released else None]
    if kind == _RAWSHM:
        name, nbytes = msgspec.msgpack.decode(body)
        np.frombuffer(side.attach(name).buf, dtype=np.float32, count=nbytes // 4).copy()
        return [time.time_ns() - sent, None]
    raise ValueError(f"unknown request kind {kind!r}")


def _peer_main(pull_address: str, push_address: str) -> None:
    serve(pull_address, push_address, _answer)


def _async_peer_main(pull_address: str, push_address: str) -> None:
    """Pings only, received by an asyncio event loop (zmq.asyncio), as stage workers do."""
    import zmq
    import zmq.asyncio

    async def pings() -> None:
        context = zmq.asyncio.Context()
        pull = context.socket(zmq.PULL)
        pull.bind(pull_address)
        push = zmq.Context.shadow(context.underlying).socket(zmq.PUSH)
        push.connect(push_address)
        encode = msgspec.msgpack.encode
        push.send(encode([0, None]))
        while True:
            raw = await pull.recv()
            if raw[:1] != _PING:
                break
            push.send(encode([time.time_ns() - int.from_bytes(raw[1:9], "little"), None]))
        push.close(linger=1000)
        pull.close(linger=0)

    asyncio.run(pings())


def start_peer(directory: Path, target: Callable[[str, str], None] = _peer_main) -> Peer:
    """A child process answering pings and shm transfers (or only pings, on an event loop)."""
    from omnictl.messages import ShmRef

    return Peer(directory, target, tuple[int, ShmRef | None])


def raw_ping(peer: Peer, count: int, warmup: int = 20) -> list[int]:
    """One-way ns of small PUSH/PULL messages, one at a time (each waits for the reply)."""
    padding = bytes(120)  # about the size of a small DataReady
    result = []
    for index in range(warmup + count):
        dt, _ = peer.ask(_PING, time.time_ns(), padding)
        if index >= warmup:
            result.append(dt)
    return result


def shm_transfers(peer: Peer, nbytes: int, count: int, knobs: dict[str, Any], warmup: int = 3) -> dict[str, list[int]]:
    """ns from before encode / copy-in (process A) to after decode / copy-out (process B),
    the real codec (per knob set) and a plain SharedMemory copy interleaved iteration by
    iteration, so both see the same machine load."""
    from multiprocessing import shared_memory

    from omnictl.topology.model import RelayKnobs
    from omnictl.transports.codec import PayloadCodec
    from omnictl.transports.shm import SlotPool

    data = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    codecs = {
        label: PayloadCodec(SlotPool("bench", f"a{i}", k.slot_bytes, k.slots), k)
        for i, (label, k) in enumerate((label, RelayKnobs(**kw)) for label, kw in knobs.items())
    }
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    target = np.ndarray(data.shape, dtype=np.float32, buffer=segment.buf)
    name_body = msgspec.msgpack.encode([segment.name, nbytes])
    times: dict[str, list[int]] = {label: [] for label in codecs} | {"raw": []}
    try:
        for index in range(warmup + count):
            for label, codec in codecs.items():
                started = time.time_ns()
                payload = codec.encode({"x": data})
                dt, ref = peer.ask(_CODEC, started, msgspec.msgpack.encode(payload))
                if ref is not None:
                    codec.pool.release(ref)
                if index >= warmup:
                    times[label].append(dt)
            started = time.time_ns()
            np.copyto(target, data)
            dt, _ = peer.ask(_RAWSHM, started, name_body)
            if index >= warmup:
                times["raw"].append(dt)
    finally:
        for codec in codecs.values():
            codec.pool.close()
        del target
        segment.close()
        segment.unlink()
    return times


# --- sections ----------------------------------------------------------------------------


class Results:
    def __init__(self) -> None:
        self.goals: list[tuple[str, str, bool | None]] = []  # (goal, measured, met)

    def goal(self, name: str, measured: str, met: bool | None) -> None:
        self.goals.append((name, measured, met))


async def pipeline_hops(
    topologies: dict[str, Path], run_dir: Path, src: str, dst: str, inputs: Callable[[int], tuple[str, dict[str, Any]]],
    count: int, warmup: int, between: Callable[[int], None] | None = None,
) -> dict[str, dict[str, list[int]]]:
    """Hop ns per pipeline and input kind (``inputs`` returns (kind, data)) through
    profiled pipelines launched together; requests one at a time, round-robin over the
    pipelines (``between`` runs after each round: raw floors measured alongside)."""
    import contextlib

    import omnictl

    kinds: dict[str, str] = {}
    result: dict[str, dict[str, list[int]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        pipes = {
            label: await stack.enter_async_context(
                omnictl.Pipeline.launch(path, device="cpu", run_dir=run_dir / label, profile=True)
            )
            for label, path in topologies.items()
        }
        for index in range(warmup + count):
            kind, data = inputs(index)
            rid = f"{'w' if index < warmup else 'm'}-{index}"
            order = list(pipes.values())
            for pipe in order[index % len(order):] + order[: index % len(order)]:  # rotate who goes first
                handle = await pipe.submit(data, request_id=rid)
                await handle.result()
            if index >= warmup:
                kinds[rid] = kind
            if between is not None:
                between(index)
        await flush_profile()
        for label, pipe in pipes.items():
            result[label] = {}
            for rid, dt in hop_latencies(pipe, src, dst, set(kinds)).items():
                result[label].setdefault(kinds[rid], []).append(dt)
    return result


def section_a(directory: Path, quick: bool, results: Results, console: Any, table_cls: Any) -> None:
    count, warmup = (60, 20) if quick else (500, 50)
    two_stages = [
        {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"]},
        {"name": "b", "factory": "omnictl.models.examples.identity", "terminal": True},
    ]
    topologies = {
        "inproc": write_topology(directory, "hop-inproc", [{**s, "process": "p"} for s in two_stages]),
        "shm": write_topology(directory, "hop-shm", two_stages),
    }
    small = lambda i: ("small", {"text": f"request {i}", "tokens": list(range(8))})  # noqa: E731
    peers = {"raw": start_peer(directory / "p1"), "async": start_peer(directory / "p2", _async_peer_main)}
    raw: dict[str, list[int]] = {label: [] for label in peers}
    padding = bytes(120)  # about the size of a small DataReady

    def ping(index: int) -> None:
        for label, peer in peers.items():
            dt, _ = peer.ask(_PING, time.time_ns(), padding)
            if index >= warmup:
                raw[label].append(dt)

    try:
        measured = asyncio.run(pipeline_hops(topologies, directory / "run-a", "a", "b", small, count, warmup, ping))
        hot = raw_ping(peers["raw"], count)  # back to back: the receiver never idles long
    finally:
        for peer in peers.values():
            peer.close()
    hops = {label: measured[label]["small"] for label in topologies}
    raw_p50 = pct(raw["raw"], 50)
    table = table_cls(title=f"(a) hop latency, small payloads ({count} sequential requests each, interleaved)")
    for column in ("path", "n", "p50", "p99", "p50 / raw p50"):
        table.add_column(column, justify="right" if column != "path" else "left")
    for label, values in hops.items():
        table.add_row(f"pipeline hop, {label}", str(len(values)), us(pct(values, 50)), us(pct(values, 99)),
                      f"{pct(values, 50) / raw_p50:.2f}x")
    table.add_row("raw pyzmq PUSH/PULL, 2 processes", str(len(raw["raw"])), us(raw_p50), us(pct(raw["raw"], 99)), "1.00x")
    table.add_row("  same, receiver on a zmq.asyncio loop", str(len(raw["async"])), us(pct(raw["async"], 50)),
                  us(pct(raw["async"], 99)), f"{pct(raw['async'], 50) / raw_p50:.2f}x")
    table.add_row("raw pyzmq, back-to-back pings (not interleaved)", str(len(hot)), us(pct(hot, 50)),
                  us(pct(hot, 99)), f"{pct(hot, 50) / raw_p50:.2f}x")
    console.print(table)
    console.print("interleaved: each round sends one request through each pipeline, then one raw ping of each kind; "
                  "the goal ratio uses the interleaved raw p50")
    ratio = pct(hops["shm"], 50) / raw_p50
    results.goal("(a) shm hop p50 <= 2x raw zmq p50 (interleaved)",
                 f"{ratio:.2f}x ({us(pct(hops['shm'], 50))} vs {us(raw_p50)})", ratio <= 2.0)
    strict = pct(hops["shm"], 50) / pct(hot, 50)
    results.goal("(a) same against back-to-back raw pings (stricter)",
                 f"{strict:.2f}x ({us(pct(hops['shm'], 50))} vs {us(pct(hot, 50))})", strict <= 2.0)


def section_b(directory: Path, quick: bool, results: Results, console: Any, table_cls: Any) -> None:
    sizes = {4 * MiB: 10 if quick else 60, 64 * MiB: 3 if quick else 20}
    peer = start_peer(directory)
    rows = []
    try:
        for nbytes, count in sizes.items():
            knobs = {"shm codec, default knobs (8 x 8 MiB slots)": {}}
            if nbytes > 8 * MiB:
                knobs["shm codec, slot_bytes 128 MiB (fits)"] = {"slot_bytes": 128 * MiB, "slots": 2}
            times = shm_transfers(peer, nbytes, count, knobs)
            raw_p50 = pct(times["raw"], 50)
            for label, values in times.items():
                name = label if label != "raw" else "raw SharedMemory copy-in/copy-out"
                rows.append((nbytes, name, values, raw_p50))
                if label != "raw":
                    share = raw_p50 / pct(values, 50)
                    results.goal(
                        f"(b) {nbytes // MiB} MiB {label.removeprefix('shm codec, ')}: shm >= 60% of raw GB/s",
                        f"{share:.0%} ({nbytes / pct(values, 50):.2f} vs {nbytes / raw_p50:.2f} GB/s)",
                        share >= 0.6,
                    )
    finally:
        peer.close()
    table = table_cls(title="(b) tensor transfer between two processes: encode/copy-in -> decode/copy-out")
    for column in ("size", "path", "n", "p50", "GB/s (p50)", "best", "% of raw"):
        table.add_column(column, justify="right" if column not in ("path",) else "left")
    for nbytes, name, values, raw_p50 in rows:
        table.add_row(f"{nbytes // MiB} MiB", name, str(len(values)), ms(pct(values, 50) / 1e9),
                      f"{nbytes / pct(values, 50):.2f}", ms(min(values) / 1e9), f"{raw_p50 / pct(values, 50):.0%}")
    console.print(table)

    # Hop latency by payload size through a real pipeline: inproc passes the object, so it
    # must not grow with size; shm (separate processes) copies twice, for comparison.
    sizes_hop = [1 * KiB, 1 * MiB, 64 * MiB]
    per_size = 5 if quick else 40
    two_stages = [
        {"name": "src", "factory": f"{HERE}.tensor_source", "next": ["sink"]},
        {"name": "sink", "factory": f"{HERE}.tensor_sink", "terminal": True},
    ]
    inproc = write_topology(directory, "size-inproc", [{**s, "process": "p"} for s in two_stages])
    shm = write_topology(directory, "size-shm", two_stages)

    def by_size(index: int) -> tuple[str, dict[str, Any]]:
        nbytes = sizes_hop[index % len(sizes_hop)]
        return str(nbytes), {"nbytes": nbytes}

    warm = 2 * len(sizes_hop)
    total = per_size * len(sizes_hop)
    hops = asyncio.run(pipeline_hops({"inproc": inproc, "shm": shm}, directory / "run-b", "src", "sink",
                                     by_size, total, warm))
    table = table_cls(title=f"(b) pipeline hop latency by payload size (tensor in the payload dict, {per_size} requests per size, interleaved)")
    table.add_column("transport")
    for nbytes in sizes_hop:
        label = f"{nbytes // KiB} KiB" if nbytes < MiB else f"{nbytes // MiB} MiB"
        table.add_column(f"{label} p50", justify="right")
        table.add_column(f"{label} p99", justify="right")
    for transport, values in hops.items():
        cells = []
        for nbytes in sizes_hop:
            cells += [us(pct(values.get(str(nbytes), []), 50)), us(pct(values.get(str(nbytes), []), 99))]
        table.add_row(transport, *cells)
    console.print(table)
    small, large = pct(hops["inproc"][str(1 * KiB)], 50), pct(hops["inproc"][str(64 * MiB)], 50)
    results.goal("(b) inproc hop flat in payload size (64 MiB p50 <= 1.5x 1 KiB p50)",
                 f"{us(small)} -> {us(large)} ({large / small:.2f}x)", large <= 1.5 * small)


async def throughput_rounds(
    topologies: dict[str, Path], concurrencies: list[int], requests: dict[int, int], warmup: int, rounds: int
) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """Every pipeline launched at once; each round measures every (concurrency, pipeline)
    point in turn, so all pipelines see the same spread of machine load."""
    import contextlib

    import omnictl

    inputs = lambda i: {"text": f"request {i}"}  # noqa: E731
    points: dict[str, dict[int, list[tuple[float, float]]]] = {label: {c: [] for c in concurrencies} for label in topologies}
    async with contextlib.AsyncExitStack() as stack:
        pipes = {label: await stack.enter_async_context(omnictl.Pipeline.launch(path, device="cpu", profile=False))
                 for label, path in topologies.items()}
        for label, pipe in pipes.items():
            await closed_loop(pipe, inputs, warmup, 16, "w")
        for round_index in range(rounds):
            for concurrency in concurrencies:
                order = list(pipes.items())
                shift = round_index % len(order)
                for label, pipe in order[shift:] + order[:shift]:
                    rate, latencies, _ = await closed_loop(
                        pipe, inputs, requests[concurrency], concurrency, f"r{round_index}-c{concurrency}"
                    )
                    points[label][concurrency].append((rate, pct(latencies, 50)))
    return points


def section_c(directory: Path, quick: bool, results: Results, console: Any, table_cls: Any) -> None:
    concurrencies = [1, 16, 64]
    requests = {1: 40, 16: 100, 64: 200} if quick else {1: 200, 16: 500, 64: 800}
    warmup, rounds = (20, 1) if quick else (100, 3)
    topologies: dict[str, Path] = {}
    for n in (3, 8):
        for placement in ("process per stage", "one process"):
            stages = []
            for i in range(n):
                stage: dict[str, Any] = {"name": f"s{i}", "factory": "omnictl.models.examples.identity"}
                if i < n - 1:
                    stage["next"] = [f"s{i + 1}"]
                else:
                    stage["terminal"] = True
                if placement == "one process":
                    stage["process"] = "all"
                stages.append(stage)
            label = f"{n} stages, {placement}"
            topologies[label] = write_topology(directory, f"noop-{n}-{placement.replace(' ', '-')}", stages)
    points = asyncio.run(throughput_rounds(topologies, concurrencies, requests, warmup, rounds))
    table = table_cls(title=f"(c) no-op pipelines (identity stages, profiling off, closed loop; median of {rounds} "
                            f"interleaved round{'s' if rounds > 1 else ''})")
    table.add_column("pipeline")
    for concurrency in concurrencies:
        table.add_column(f"c={concurrency} req/s", justify="right")
        table.add_column(f"c={concurrency} p50", justify="right")
    medians: dict[str, dict[int, float]] = {}
    for label in topologies:
        cells = []
        medians[label] = {}
        for concurrency in concurrencies:
            rates = [rate for rate, _ in points[label][concurrency]]
            p50s = [p50 for _, p50 in points[label][concurrency]]
            medians[label][concurrency] = statistics.median(rates)
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
            cells += [f"{statistics.median(rates):,.0f}{spread}", ms(statistics.median(p50s))]
        table.add_row(label, *cells)
    console.print(table)
    console.print(f"requests per point and round: {requests} (after {warmup} warm-up requests); "
                  f"req/s: median (min-max over rounds); p50 = submit -> result")
    for placement in ("process per stage", "one process"):
        rate = medians[f"3 stages, {placement}"][64]
        results.goal(f"(c) no-op 3 stages ({placement}) >= 1,000 req/s at c=64", f"{rate:,.0f} req/s", rate >= 1000)


async def text_path_latencies(topologies: dict[str, Path], count: int, warmup: int) -> dict[str, list[float]]:
    """All variants launched at once; one request at a time, round-robin over the
    variants, so every variant sees the same machine load."""
    import contextlib

    import omnictl

    async with contextlib.AsyncExitStack() as stack:
        pipes = {label: await stack.enter_async_context(omnictl.Pipeline.launch(path, device="cpu", profile=False))
                 for label, path in topologies.items()}
        latencies: dict[str, list[float]] = {label: [] for label in topologies}
        order = list(pipes.items())
        for index in range(warmup + count):
            # Rotate who goes first: the pipeline right after a multi-process one pays for
            # that one's leftover work on a small machine.
            for label, pipe in order[index % len(order):] + order[: index % len(order)]:
                started = time.perf_counter()
                handle = await pipe.submit({"text": f"request {index}"})
                await handle.result()
                if index >= warmup:
                    latencies[label].append(time.perf_counter() - started)
    return latencies


def section_d(directory: Path, quick: bool, results: Results, console: Any, table_cls: Any) -> None:
    count, warmup = (30, 5) if quick else (300, 30)
    rows, cols = 512, 2048
    think = {"name": "thinker", "factory": f"{HERE}.thinker", "factory_args": {"rows": rows, "cols": cols},
             "next": ["decode"]}
    decode = {"name": "decode", "factory": f"{HERE}.detokenize", "terminal": True, "modality": "text"}
    variants = {
        "co-located + projection (drop hidden)": write_topology(directory, "text-coloc-proj", [
            {**think, "process": "thinker", "project": {"decode": "omnictl.models.examples.drop_hidden"}},
            {**decode, "process": "thinker"},
        ]),
        "co-located, no projection (hidden by reference)": write_topology(directory, "text-coloc", [
            {**think, "process": "thinker"}, {**decode, "process": "thinker"},
        ]),
        "decode in another process + projection (ids only cross)": write_topology(directory, "text-split-proj", [
            {**think, "project": {"decode": "omnictl.models.examples.drop_hidden"}}, decode,
        ]),
        "decode in another process, no projection (hidden via shm)": write_topology(directory, "text-split", [
            think, decode,
        ]),
    }
    measured = asyncio.run(text_path_latencies(variants, count, warmup))
    labels = list(variants)
    base = measured[labels[-1]]
    table = table_cls(title=f"(d) text-only path: thinker (64 ids + {rows}x{cols} float32 hidden = "
                            f"{rows * cols * 4 // MiB} MiB) -> decode, {count} sequential requests per variant, interleaved (rotating order)")
    for column in ("placement", "mean", "p50", "p99", "vs. split (mean)", "vs. split (p50)"):
        table.add_column(column, justify="left" if column == "placement" else "right")
    for label in labels:
        values = measured[label]
        mean_cut = 1 - statistics.fmean(values) / statistics.fmean(base)
        p50_cut = 1 - pct(values, 50) / pct(base, 50)
        table.add_row(label, ms(statistics.fmean(values)), ms(pct(values, 50)), ms(pct(values, 99)),
                      f"{-mean_cut:+.0%}", f"{-p50_cut:+.0%}")
    console.print(table)
    cut = 1 - statistics.fmean(measured[labels[0]]) / statistics.fmean(base)
    p50_cut = 1 - pct(measured[labels[0]], 50) / pct(base, 50)
    results.goal("(d) co-located + projection vs split: latency reduction (article: 33%)",
                 f"mean {cut:.0%} lower, p50 {p50_cut:.0%} lower", cut >= 0.33)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations: a smoke test under a minute")
    parser.add_argument("--sections", default="abcd", help="which sections to run (default: abcd)")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    results = Results()
    started = time.perf_counter()
    console.print(f"omnictl runtime benchmark ({'quick' if args.quick else 'full'}), "
                  f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    sections = {"a": section_a, "b": section_b, "c": section_c, "d": section_d}
    with tempfile.TemporaryDirectory(prefix="omx-bench-") as tmp:  # short: ipc paths are limited
        for key in args.sections:
            section_started = time.perf_counter()
            sections[key](Path(tmp), args.quick, results, console, Table)
            console.print(f"[dim]section ({key}) took {time.perf_counter() - section_started:.1f} s[/dim]\n")

    table = Table(title="summary: goals")
    table.add_column("goal")
    table.add_column("measured", justify="right")
    table.add_column("met", justify="center")
    for name, measured, met in results.goals:
        table.add_row(name, measured, "n/a" if met is None else ("yes" if met else "NO"))
    console.print(table)
    console.print(f"total {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.1f} "
                  f"(other work on this machine skews every figure; ratios are measured side by side)")


if __name__ == "__main__":
    main()
