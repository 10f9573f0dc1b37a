"""How fast a tensor moves between two processes on one GPU over omnictl's ``cuda_ipc`` codec.

Two processes, as two stage processes on one GPU: the sender makes a fresh ``--mib`` MiB
tensor on the GPU each round and encodes it with the ``cuda_ipc`` codec (what a stage does
on a ``cuda_ipc`` edge: the tensor leaf becomes torch's CUDA IPC handle), and sends the
encoded payload over a pipe; the receiver decodes it (opens the handle), copies the tensor
into memory of its own (so the sender may free it), waits for the copy and answers. Timed at
the sender, from before the encode to the answer: a whole round trip, so the figure is a
floor of the one-way rate. Median of ``--repeats`` rounds after ``--warmup``; each round's
copy is checked against the value the sender wrote.

``--device cpu`` (the CPU dry run of ``benchmarks/gpu_session.sh``): the ``shm`` codec and a
host tensor, which is what two CPU stage processes use.

Goal (issue 38), printed met / not met: on one GPU, 64 MiB at >= 100 GB/s
(``--goal-gbs``; decimal GB). ``--json PATH`` also writes the figures there.

Run: ``python benchmarks/cuda_ipc_bandwidth.py [--device cuda] [--mib 64]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from multiprocessing.connection import Connection  # noqa: E402
from typing import Any  # noqa: E402

GOAL_GBS = 100.0


def _codec(device: str) -> Any:
    from omnictl.topology.model import RelayKnobs, Transport
    from omnictl.transports.registry import codec_for
    from omnictl.transports.shm import SlotPool

    transport = Transport.CUDA_IPC if device.startswith("cuda") else Transport.SHM
    # one slot per round in flight: the receiver releases it by its answer
    knobs = RelayKnobs(slot_bytes=1 << 20, slots=2, inline_bytes=16 * 1024)
    return codec_for(transport, SlotPool("bench", "sender", knobs.slot_bytes, knobs.slots), knobs)


def receiver(conn: Connection, device: str) -> None:
    """Decode each payload, copy the tensor into this process's memory, answer with its
    first value (the check) and the shm ref to release, if any."""
    import torch

    import omnictl.topology  # noqa: F401  # first: the package's import order (codec alone is a cycle)
    from omnictl.transports.codec import decode
    from omnictl.transports.shm import SegmentReader

    reader = SegmentReader()
    mine: torch.Tensor | None = None
    while True:
        payload = conn.recv()
        if payload is None:
            break
        tensor = decode(payload, reader)["t"]
        if mine is None or mine.shape != tensor.shape:
            mine = torch.empty_like(tensor, device=device)
        mine.copy_(tensor)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        del tensor  # the sender's memory is its own again
        conn.send((float(mine[0].item()), payload.shm))
    reader.close()


def measure(device: str, mib: int, repeats: int, warmup: int) -> dict[str, Any]:
    import torch

    numel = mib * (1 << 20) // 4
    codec = _codec(device)
    context = multiprocessing.get_context("spawn")  # a CUDA context does not survive fork
    ours, theirs = context.Pipe()
    child = context.Process(target=receiver, args=(theirs, device), daemon=True)
    child.start()
    times: list[float] = []
    try:
        for round_ in range(warmup + repeats):
            value = float(round_ + 1)
            tensor = torch.full((numel,), value, dtype=torch.float32, device=device)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            began = time.perf_counter()
            ours.send(codec.encode({"t": tensor}))
            while not ours.poll(1.0):  # a receiver that died never answers
                if not child.is_alive():
                    raise RuntimeError(f"the receiving process ended (exit code {child.exitcode}) in round {round_}")
            first, ref = ours.recv()
            elapsed = time.perf_counter() - began
            if first != value:
                raise RuntimeError(f"round {round_}: the receiver read {first}, the sender wrote {value}")
            if ref is not None:
                codec.pool.release(ref)
            if round_ >= warmup:
                times.append(elapsed)
            del tensor
            if device.startswith("cuda"):
                torch.cuda.ipc_collect()  # frees what torch kept for a receiver that held a reference
        ours.send(None)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        codec.pool.close()
    seconds = statistics.median(times)
    nbytes = numel * 4
    return {
        "device": device,
        "transport": "cuda_ipc" if device.startswith("cuda") else "shm",
        "mib": mib,
        "rounds": repeats,
        "median_ms": seconds * 1000,
        "best_ms": min(times) * 1000,
        "gb_per_s": nbytes / seconds / 1e9,
        "best_gb_per_s": nbytes / min(times) / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the cuda_ipc codec) or cpu (shm; default cuda)")
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    parser.add_argument("--goal-gbs", type=float, default=GOAL_GBS, help="the goal in GB/s (default 100)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.mib < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--mib and --repeats must be at least 1, --warmup at least 0")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA GPU (use --device cpu for the shm codec)")
    figures = measure(args.device, args.mib, args.repeats, args.warmup)
    met = figures["device"].startswith("cuda") and figures["mib"] >= 64 and figures["gb_per_s"] >= args.goal_gbs
    figures["goal_gbs"] = args.goal_gbs
    figures["met"] = met
    print(f"{figures['transport']}: {figures['mib']} MiB between two processes on {figures['device']}: "
          f"median {figures['median_ms']:.3f} ms a round trip = {figures['gb_per_s']:.1f} GB/s "
          f"(best {figures['best_gb_per_s']:.1f} GB/s, {figures['rounds']} rounds)")
    on = "" if figures["device"].startswith("cuda") and figures["mib"] >= 64 else " (not judged: needs 64 MiB on a GPU)"
    print(f"goal: cuda_ipc moves 64 MiB between two processes on one GPU at >= {args.goal_gbs:g} GB/s: "
          f"{figures['gb_per_s']:.1f} GB/s -> {'met' if met else 'NOT met'}{on}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
