"""Moshi full duplex on CPU: per-frame latency at real time, and the real-time factor.

Two runs of ``topologies/moshi.yaml`` through ``omnictl.Pipeline`` (the real runtime:
processes, shared memory) on a checkpoint written by ``python -m omnictl.models.moshi.tiny``:

1. **At real time**: ``--seconds`` of speech-like audio sent in 80 ms chunks, each when a
   microphone would have finished recording it. A frame's latency is the time from the send
   of the chunk that completes its 80 ms of input to its 80 ms of Moshi's audio arriving
   back: what a listener waits beyond the frame itself. Met when the p99 is under one frame
   (80 ms): the model keeps up and does not drift behind.
2. **As fast as it goes**: the same audio sent at once; the real-time factor is the time
   from the first send to the last frame back over the seconds of audio (under 1: faster
   than real time, the headroom a session has).
3. **CPU time per frame**, stage by stage, stepped in this process with each thread's own
   CPU clock: what a frame costs whatever else runs on the machine (the two figures above
   are wall-clock times, and move with the machine's load).

Run: ``python benchmarks/moshi_duplex.py --model-path /tmp/moshi-tiny [--seconds 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import omnictl
from omnictl.outputs import AudioChunk
from omnictl.request import RequestEventKind

TOPOLOGY = Path(__file__).resolve().parents[1] / "topologies" / "moshi.yaml"
RATE, FRAME = 24_000, 1_920  # Mimi: 24 kHz, 80 ms a frame


def speechlike(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * RATE)) / RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    voice = 0.3 * envelope * np.sin(2 * np.pi * 160 * t)
    return (voice + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


async def session(pipe: Any, audio: np.ndarray, paced: bool) -> tuple[list[float], list[float], float]:
    """(sent, back, start): when each frame's last input chunk went out, when its audio came back."""
    loop = asyncio.get_running_loop()
    request = await pipe.submit({"sampling": {"temperature": 0}}, input_stream=True)
    sent: list[float] = []
    start = loop.time()

    async def feed() -> None:
        for index, at in enumerate(range(0, len(audio) - FRAME + 1, FRAME)):
            if paced:
                await asyncio.sleep(max(0.0, start + (index + 1) * FRAME / RATE - loop.time()))
            sent.append(loop.time())
            await request.send(AudioChunk(samples=audio[at : at + FRAME], sample_rate=RATE))
        await request.end_input()

    feeder = asyncio.create_task(feed())
    back = [
        loop.time()
        async for event in request.events()
        if event.kind is RequestEventKind.STREAM and isinstance(event.data, AudioChunk)
    ]
    await feeder
    await request.result()
    return sent, back, start


def cpu_per_frame(model_path: str, seconds: float) -> dict[str, float]:
    """Each stage's CPU time per frame (its thread's, one torch thread as a stage process has on
    two cores), in this process: the compute a frame costs, whatever else the machine runs."""
    import torch

    from omnictl.models.mimi.codec import load_mimi
    from omnictl.models.mimi.streaming import StreamDecoder, StreamEncoder
    from omnictl.models.moshi.model import Depth, Temporal
    from omnictl.schedulers.sampling import Sampler, SamplingParams

    torch.set_num_threads(1)
    mimi = load_mimi(model_path)
    temporal, depth = Temporal(model_path), Depth(model_path)
    encoder, decoder = StreamEncoder(mimi, temporal.codebooks), StreamDecoder(mimi)
    greedy = Sampler(SamplingParams(temperature=0.0))
    session = temporal.open()
    previous = depth.codes(temporal.step(session, greedy, None, None), greedy)
    spent = {"mimi encoder": 0.0, "temporal": 0.0, "depth": 0.0, "mimi decoder": 0.0}
    audio = speechlike(seconds)
    frames = len(audio) // FRAME
    for index in range(frames):
        started = time.thread_time()
        user = encoder.push(audio[index * FRAME : (index + 1) * FRAME])[0]
        encoded = time.thread_time()
        step = temporal.step(session, greedy, previous, user)
        stepped = time.thread_time()
        codes = depth.codes(step, greedy)
        made = time.thread_time()
        decoder.push(torch.cat([previous[:1], codes[1:]])[None])
        decoded = time.thread_time()
        previous = codes
        for name, spell in zip(spent, (encoded - started, stepped - encoded, made - stepped, decoded - made)):
            spent[name] += spell
    return {name: total / frames * 1000 for name, total in spent.items()}


async def measure(model_path: str, seconds: float, options_trace: bool = False) -> int:
    audio = speechlike(seconds)
    frames = len(audio) // FRAME
    async with omnictl.Pipeline.launch(
        TOPOLOGY, model_path=model_path, device="cpu", profile=False, request_timeout=seconds * 10 + 60
    ) as pipe:
        await session(pipe, speechlike(2.0), paced=False)  # warm: first calls, allocations
        sent, back, _ = await session(pipe, audio, paced=True)
        fast_sent, fast_back, fast_start = await session(pipe, audio, paced=False)
    if len(back) != frames or len(fast_back) != frames:
        print(f"FRAMES MISSING: {len(back)} and {len(fast_back)} of {frames}")
        return 1
    lag = (np.array(back) - np.array(sent)) * 1000
    p50, p99 = np.percentile(lag, 50), np.percentile(lag, 99)
    rtf = (fast_back[-1] - fast_start) / seconds
    met = p99 < FRAME / RATE * 1000
    print(f"{seconds:g} s of input, {frames} frames of 80 ms, each one back (none missing)")
    print(f"at real time: frame latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {lag.max():.1f} ms")
    print(f"as fast as it goes: real-time factor {rtf:.2f} ({1 / max(rtf, 1e-9):.1f}x real time)")
    if options_trace:
        print("frame latency over the session (ms, every 25th frame):", " ".join(f"{x:.0f}" for x in lag[::25]))
    cpu = cpu_per_frame(model_path, min(seconds, 10.0))
    total = sum(cpu.values())
    each = ", ".join(f"{name} {ms:.1f} ms" for name, ms in cpu.items())
    print(f"CPU time per frame (thread time, one thread): {each}; {total:.1f} ms in all, {total / 80:.2f} of a frame")
    print(f"p99 frame latency under one frame (80 ms): {'met' if met else 'not met'}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-path", required=True, help="a Moshi checkpoint (python -m omnictl.models.moshi.tiny DIR)"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of input per session (default 20)")
    parser.add_argument("--over-time", action="store_true", help="also print every 25th frame's latency, in order")
    options = parser.parse_args()
    started = time.perf_counter()
    code = asyncio.run(measure(options.model_path, options.seconds, options.over_time))
    print(f"({time.perf_counter() - started:.0f} s in all)")
    sys.exit(code)


if __name__ == "__main__":
    main()
