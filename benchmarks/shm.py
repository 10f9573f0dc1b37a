"""A large tensor from one process to another through ``shm``, against its floors, in one run.

Each iteration times, interleaved (so every path sees the same machine load), from just
before process A starts encoding to the moment process B holds a usable tensor:

- ``shm codec, views``: the real codec (``PayloadCodec.encode``: one copy into a reused
  slot) and the real receive side (``ViewLeases.decode``: a tensor *on* the slot, no copy);
  the slot goes back when B frees the tensor.
- ``shm codec, copy out``: the same, with the receiver copying out (before views).
- floor ``reused-slot copy``: A copies into an already mapped, reused shared-memory
  buffer and sends its name; B maps it once and does nothing (one copy plus a message:
  what any copy-based transport pays).
- floor ``memcpy``: one in-process copy between two warm private buffers (no message).

Goal (issue 14, goal 2): 64 MiB over shm >= 8 GB/s effective (median of the runs).
Run: ``python benchmarks/shm.py [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the peer process inherits sys.path: this checkout's omnictl

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.peer import Peer, PeerSide, serve  # noqa: E402

MiB = 1024 * 1024
GOAL_GBPS = 8.0

# Requests to the peer (benchmarks/peer.py): it answers each with [one-way ns, slots to release].
_VIEW, _COPY, _SLOT = b"v", b"c", b"s"


def _answer(side: PeerSide, kind: bytes, sent: int, body: bytes) -> list[Any]:
    """Process B's side of each transfer."""
    from omnictl.transports.codec import decode

    if kind == _VIEW:
        data = side.leases.decode(side.payloads.decode(body))
        dt = time.time_ns() - sent
        del data  # freed: its slot is queued for release
        released = list(side.released)
        side.released.clear()
        return [dt, released]
    if kind == _COPY:
        payload = side.payloads.decode(body)
        data = decode(payload, side.reader)
        dt = time.time_ns() - sent
        del data
        return [dt, [payload.shm] if payload.shm else []]
    if kind == _SLOT:
        side.attach(body.decode())
        return [time.time_ns() - sent, []]
    raise ValueError(f"unknown request kind {kind!r}")


def _peer(pull_address: str, push_address: str) -> None:
    serve(pull_address, push_address, _answer)


def start_peer(directory: Path) -> Peer:
    from omnictl.messages import ShmRef

    return Peer(directory, _peer, tuple[int, list[ShmRef]])


def measure(peer: Peer, nbytes: int, count: int, warmup: int = 3) -> dict[str, list[int]]:
    """One-way ns per path, interleaved iteration by iteration."""
    from multiprocessing import shared_memory

    import msgspec

    from omnictl.topology.model import RelayKnobs
    from omnictl.transports.codec import PayloadCodec
    from omnictl.transports.shm import SlotPool

    data = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    knobs = RelayKnobs()  # the defaults: 8 x 8 MiB slots; a 64 MiB payload gets a segment of its own
    codecs = {kind: PayloadCodec(SlotPool("bench", f"s{kind.decode()}", knobs.slot_bytes, knobs.slots), knobs)
              for kind in (_VIEW, _COPY)}
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    slot = np.ndarray(data.shape, dtype=np.float32, buffer=segment.buf)
    slot[:] = 0  # mapped and touched once, as a reused slot is
    private = np.empty_like(data)
    times: dict[str, list[int]] = {"views": [], "copy": [], "slot": [], "memcpy": []}
    try:
        for index in range(warmup + count):
            for kind, label in ((_VIEW, "views"), (_COPY, "copy")):
                codec = codecs[kind]
                started = time.time_ns()
                payload = codec.encode({"x": data})
                dt, refs = peer.ask(kind, started, msgspec.msgpack.encode(payload))
                for ref in refs:
                    codec.pool.release(ref)
                if index >= warmup:
                    times[label].append(dt)
            started = time.time_ns()
            np.copyto(slot, data)
            dt, _ = peer.ask(_SLOT, started, segment.name.encode())
            if index >= warmup:
                times["slot"].append(dt)
            started = time.perf_counter_ns()
            np.copyto(private, data)
            if index >= warmup:
                times["memcpy"].append(time.perf_counter_ns() - started)
    finally:
        for codec in codecs.values():
            codec.pool.close()
        del slot
        segment.close()
        segment.unlink()
    return times


LABELS = {
    "views": "shm codec, receiver gets views (now)",
    "copy": "shm codec, receiver copies out (before)",
    "slot": "floor: copy into a reused shm slot + message",
    "memcpy": "floor: memcpy, one process",
}


def plot(medians: dict[int, dict[str, list[float]]], path: Path, note: str) -> None:
    """A bar chart of the table's GB/s (median over the runs), one group per size, written to
    ``path`` (PNG). ``note`` (the date, the machine's load) goes under the title."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    labels = list(LABELS)
    sizes = list(medians)
    width = 0.8 / len(labels)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for index, label in enumerate(labels):
        gbps = [nbytes / statistics.median(medians[nbytes][label]) for nbytes in sizes]
        bars = axes.bar([x + (index - (len(labels) - 1) / 2) * width for x in range(len(sizes))], gbps, width,
                        label=LABELS[label])
        axes.bar_label(bars, fmt="%.1f", fontsize=8)
    axes.axhline(GOAL_GBPS, color="grey", linestyle="--", linewidth=1, label=f"goal at 64 MiB: {GOAL_GBPS:g} GB/s")
    axes.set_xticks(range(len(sizes)), [f"{n // MiB} MiB" for n in sizes])
    axes.set_ylabel("GB/s (bytes / median time)")
    axes.set_title(f"benchmarks/shm.py: a tensor from process A to process B\n{note}", fontsize=10)
    axes.legend(fontsize=8, loc="upper right")  # above the 64 MiB group, whose bars are lower
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke test)")
    parser.add_argument("--runs", type=int, default=None, help="repetitions of the whole comparison (median reported)")
    parser.add_argument("--plot", type=Path, metavar="PNG", default=None,
                        help="also draw the table as a bar chart into this PNG (needs matplotlib)")
    args = parser.parse_args()
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  # fail before measuring, not after
        except ImportError:
            parser.error("--plot needs matplotlib: .venv/bin/pip install matplotlib")
    runs = args.runs or (2 if args.quick else 5)
    sizes = {4 * MiB: 10 if args.quick else 40, 64 * MiB: 4 if args.quick else 12}

    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"shm transfer benchmark, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
                  f"{runs} runs, paths interleaved iteration by iteration")
    medians: dict[int, dict[str, list[float]]] = {n: {k: [] for k in LABELS} for n in sizes}
    with tempfile.TemporaryDirectory(prefix="omx-shm-") as tmp:
        peer = start_peer(Path(tmp))
        try:
            for _ in range(runs):
                for nbytes, count in sizes.items():
                    for label, values in measure(peer, nbytes, count).items():
                        medians[nbytes][label].append(statistics.median(values))
        finally:
            peer.close()
    table = Table(title="tensor from process A to process B: start of encode -> tensor usable in B (GB/s = bytes / median time)")
    table.add_column("size", justify="right")
    table.add_column("path")
    table.add_column("median", justify="right")
    table.add_column("GB/s", justify="right")
    table.add_column("GB/s per run", justify="right")
    for nbytes, per_label in medians.items():
        for label, values in per_label.items():
            median = statistics.median(values)
            table.add_row(f"{nbytes // MiB} MiB", LABELS[label], f"{median / 1e6:.2f} ms", f"{nbytes / median:.1f}",
                          " ".join(f"{nbytes / v:.1f}" for v in values))
    console.print(table)
    big = 64 * MiB
    view_gbps = big / statistics.median(medians[big]["views"])
    copy_gbps = big / statistics.median(medians[big]["copy"])
    slot_gbps = big / statistics.median(medians[big]["slot"])
    summary = Table(title="goal")
    for column in ("goal", "measured", "met"):
        summary.add_column(column)
    summary.add_row(f"64 MiB over shm >= {GOAL_GBPS:g} GB/s effective",
                    f"{view_gbps:.1f} GB/s (copy out: {copy_gbps:.1f}; reused-slot copy floor: {slot_gbps:.1f})",
                    "met" if view_gbps >= GOAL_GBPS else "not met")
    console.print(summary)
    console.print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.plot is not None:
        note = (f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
                f"median of {runs} runs" + (" (--quick)" if args.quick else ""))
        plot(medians, args.plot, note)
        console.print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
