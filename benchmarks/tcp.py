"""The ``tcp`` transport against raw pyzmq over TCP, side by side in one run (127.0.0.1).

(a) hop latency of small payloads: a pipeline hop ``a -> b`` where b's process carries another
    `node` label (tcp, CurveZMQ), from the profiler's HOP_SENT -> HOP_RECEIVED timestamps,
    against a raw pyzmq PUSH/PULL one-way message over TCP between two processes (no
    encryption). Goal: hop p50 <= 2x raw.
(b) 4 MiB and 64 MiB float32 tensors over the same hop against a raw zero-copy pyzmq TCP send
    (``send_multipart(copy=False)``, received without copy) of the same bytes. Goal: >= 60%
    of the raw GB/s (p50 of one-way times).

(c) where CURVE's time goes, for the same 4 MiB / 64 MiB: raw CURVE with the body cut into
    1 MiB frames (libzmq encrypts frame by frame, so the sender's encryption, the wire and the
    receiver's decryption can overlap; the receiver joins the frames into one buffer, as a
    tensor needs), and the libsodium work CURVE does per message measured alone in this
    process (XSalsa20-Poly1305 ``crypto_box_afternm`` / ``crypto_box_open_afternm``, from the
    libsodium pyzmq bundles) beside one memcpy of the same bytes (libzmq's CURVE copies the
    message about twice on each side, plus zero-filled scratch buffers).

Run: ``python benchmarks/tcp.py [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.runtime import MiB, flush_profile, hop_latencies, pct, us  # noqa: E402


def _raw_peer(conn: Any, keys: Any) -> None:
    """PULL on tcp; answers each message with its one-way ns (receipt minus the sent ns in frame 0)."""
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    if keys is not None:
        keys.serve(pull)
    pull.bind("tcp://127.0.0.1:*")
    conn.send(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
    reply = context.socket(zmq.PUSH)
    reply.connect(conn.recv())
    while True:
        parts = pull.recv_multipart(copy=False)
        received = time.time_ns()
        header = parts[0].bytes
        if header == b"stop":
            break
        if len(parts) > 2:  # a body cut into frames: one contiguous buffer, as a tensor needs
            joined = np.empty(sum(len(part.buffer) for part in parts[1:]), dtype=np.uint8)
            offset = 0
            for part in parts[1:]:
                view = np.frombuffer(part.buffer, dtype=np.uint8)
                joined[offset:offset + view.size] = view
                offset += view.size
            parts = [parts[0], joined]
            received = time.time_ns()
        arrays = [np.frombuffer(part if isinstance(part, np.ndarray) else part.buffer, dtype=np.float32)
                  for part in parts[1:]]  # as the receiver sees them
        reply.send(str(received - int(header)).encode() + b" " + str(sum(a.size for a in arrays)).encode())
    for socket in (pull, reply):
        socket.close(linger=0)
    context.term()


class RawPeer:
    """``curve``: the same CurveZMQ encryption the tcp transport uses (no ZAP check)."""

    def __init__(self, curve: bool = False) -> None:
        import zmq

        from omnictl.transports.curve import CurveKeys

        keys = CurveKeys.generate() if curve else None
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_raw_peer, args=(child, keys), daemon=True)
        self.process.start()
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        if keys is not None:
            keys.connect_as_client(self.push)
        self.push.connect(self._conn.recv())
        self.replies = self.context.socket(zmq.PULL)
        self.replies.bind("tcp://127.0.0.1:*")
        self._conn.send(self.replies.getsockopt(zmq.LAST_ENDPOINT).decode())

    def send(self, body: list[Any]) -> int:
        """One-way ns of one message: header frame (the send time) plus ``body`` frames, zero-copy."""
        self.push.send_multipart([str(time.time_ns()).encode(), *body], copy=False)
        return int(self.replies.recv().split()[0])

    def close(self) -> None:
        self.push.send(b"stop")
        self.process.join(10)
        self.push.close(linger=0)
        self.replies.close(linger=0)
        self.context.term()


def write_topology(directory: Path) -> Path:
    import yaml

    stages = [{"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"]},
              {"name": "b", "factory": "omnictl.models.examples.identity", "terminal": True}]
    path = directory / "tcp-hop.yaml"
    path.write_text(yaml.safe_dump({"name": "tcp-hop", "stages": stages, "processes": {"b": {"node": "far"}}}))
    return path


CHUNK = 1 * MiB  # (c): the frame size raw CURVE is also measured with


def chunked(body: list[Any]) -> list[Any]:
    """``body``'s one buffer cut into CHUNK-sized frames (views, no copy)."""
    view = memoryview(body[0]).cast("B")
    return [view[i:i + CHUNK] for i in range(0, len(view), CHUNK)]


async def measure(path: Path, run_dir: Path, peers: tuple[RawPeer, RawPeer],
                  rounds: dict[str, tuple[Any, list[Any], int, int]]) -> dict[str, dict[str, list[int]]]:
    """Per kind: pipeline hop ns, raw ns, raw CURVE ns (and, for the big ones, raw CURVE in
    1 MiB frames); one request then one raw send of each per round, interleaved."""
    import omnictl

    out: dict[str, dict[str, list[int]]] = {}
    async with omnictl.Pipeline.launch(path, device="cpu", run_dir=run_dir, profile=True) as pipe:
        for kind, (data, raw_body, count, warmup) in rounds.items():
            times: dict[str, list[int]] = {"raw": [], "curve": [], "curve 1 MiB frames": []}
            ids: set[str] = set()
            for index in range(warmup + count):
                rid = f"{kind}-{index}"
                await (await pipe.submit(data, request_id=rid)).result()
                sample = {"raw": peers[0].send(raw_body), "curve": peers[1].send(raw_body)}
                if kind != "small":
                    sample["curve 1 MiB frames"] = peers[1].send(chunked(raw_body))
                if index >= warmup:
                    ids.add(rid)
                    for name, dt in sample.items():
                        times[name].append(dt)
            await flush_profile()
            out[kind] = {"hop": list(hop_latencies(pipe, "a", "b", ids).values()), **times}
    return out


def sodium_costs(nbytes: int, repeats: int) -> dict[str, float] | None:
    """Best-of ns for CURVE's per-message crypto on ``nbytes`` (encrypt, decrypt) and one memcpy,
    here in this process; None without the libsodium pyzmq bundles (a system libzmq build)."""
    import ctypes

    import zmq

    found = sorted((Path(zmq.__file__).resolve().parents[1] / "pyzmq.libs").glob("libsodium*"))
    if not found:
        return None
    sodium = ctypes.CDLL(str(found[0]))
    if sodium.sodium_init() < 0:
        return None
    zero = 32  # crypto_box_ZEROBYTES: the API wants that much zero padding in front
    key, nonce = (ctypes.c_ubyte * 32)(*range(32)), (ctypes.c_ubyte * 24)()
    plain = np.random.default_rng(1).integers(0, 256, nbytes + zero, dtype=np.uint8)
    plain[:zero] = 0
    box, back = np.empty_like(plain), np.empty_like(plain)
    size = ctypes.c_ulonglong(nbytes + zero)
    address = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    best = {"encrypt": float("inf"), "decrypt": float("inf"), "memcpy": float("inf")}
    for _ in range(repeats):
        started = time.perf_counter_ns()
        sodium.crypto_box_afternm(address(box), address(plain), size, nonce, key)
        encrypted = time.perf_counter_ns()
        if sodium.crypto_box_open_afternm(address(back), address(box), size, nonce, key) != 0:
            raise RuntimeError("libsodium could not open its own box")
        decrypted = time.perf_counter_ns()
        np.copyto(back, plain)
        copied = time.perf_counter_ns()
        for name, ns in (("encrypt", encrypted - started), ("decrypt", decrypted - encrypted),
                         ("memcpy", copied - decrypted)):
            best[name] = min(best[name], ns)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"omnictl tcp benchmark, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    small = {"text": "request", "tokens": list(range(8))}
    rng = np.random.default_rng(0)
    big = {size: rng.standard_normal(size // 4, dtype=np.float32) for size in (4 * MiB, 64 * MiB)}
    n_small, n_big = (50, (8, 3)) if args.quick else (400, (40, 12))
    rounds = {
        "small": (small, [bytes(120)], n_small, 20),
        "4 MiB": ({"x": big[4 * MiB]}, [memoryview(big[4 * MiB])], n_big[0], 3),
        "64 MiB": ({"x": big[64 * MiB]}, [memoryview(big[64 * MiB])], n_big[1], 2),
    }
    peers = (RawPeer(), RawPeer(curve=True))
    try:
        with tempfile.TemporaryDirectory(prefix="omx-tcp-") as tmp:
            results = asyncio.run(measure(write_topology(Path(tmp)), Path(tmp) / "run", peers, rounds))
    finally:
        for peer in peers:
            peer.close()
    table = Table(title="tcp hop (CurveZMQ) vs raw pyzmq TCP (plain, and with CURVE), 127.0.0.1, interleaved")
    for column in ("payload", "n", "hop p50", "raw p50", "raw CURVE p50", "hop / raw", "hop / raw CURVE"):
        table.add_column(column, justify="left" if column == "payload" else "right")
    where = Table(title="where CURVE's time goes (p50 one-way; libsodium and memcpy: best of 3, in this process)")
    for column in ("payload", "raw", "raw CURVE", "raw CURVE, 1 MiB frames", "encrypt", "decrypt", "memcpy",
                   "raw CURVE / raw"):
        where.add_column(column, justify="left" if column == "payload" else "right")
    goals = []
    for kind, times in results.items():
        hop50, raw50, curve50 = pct(times["hop"], 50), pct(times["raw"], 50), pct(times["curve"], 50)
        n = str(len(times["hop"]))
        if kind == "small":
            table.add_row(kind, n, us(hop50), us(raw50), us(curve50),
                          f"{hop50 / raw50:.2f}x time", f"{hop50 / curve50:.2f}x time")
            goals.append(("small hop p50 <= 2x raw", f"{hop50 / raw50:.2f}x", hop50 / raw50 <= 2.0))
            continue
        nbytes = big[4 * MiB if kind == "4 MiB" else 64 * MiB].nbytes
        gbs = lambda ns: f"{us(ns)} ({nbytes / ns:.2f} GB/s)"  # noqa: E731  (bytes per ns = GB/s)
        table.add_row(kind, n, gbs(hop50), gbs(raw50), gbs(curve50),
                      f"{raw50 / hop50:.0%} of raw GB/s", f"{curve50 / hop50:.0%} of CURVE GB/s")
        crypto = sodium_costs(nbytes, 3)
        costs = [us(crypto[k]) for k in ("encrypt", "decrypt", "memcpy")] if crypto else ["n/a"] * 3
        where.add_row(kind, us(raw50), us(curve50), us(pct(times["curve 1 MiB frames"], 50)), *costs,
                      f"{raw50 / curve50:.0%} of raw GB/s")
        goals.append((f"{kind} throughput >= 60% of raw", f"{raw50 / hop50:.0%}", raw50 / hop50 >= 0.6))
        goals.append(("  the ceiling with CURVE: raw CURVE against raw", f"{raw50 / curve50:.0%}",
                      raw50 / curve50 >= 0.6))
        goals.append(("  the transport against raw CURVE (its own overhead)", f"{curve50 / hop50:.0%}",
                      curve50 / hop50 >= 0.6))
    console.print(table)
    console.print(where)
    for name, measured, met in goals:
        console.print(f"goal {name}: {measured} -> {'met' if met else 'NOT met'}")
    console.print(f"load average {os.getloadavg()[0]:.1f} (other work on this machine skews every figure)")


if __name__ == "__main__":
    main()
