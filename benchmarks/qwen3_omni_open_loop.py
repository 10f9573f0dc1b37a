"""Qwen3-Omni where compute dominates: the staged pipeline against monolithic ``generate``
under open-loop Poisson arrivals, side by side.

A mid-size random-weight checkpoint (``omnictl.models.qwen3_omni.tiny``, ``--size mid``:
one thinker decode step costs several milliseconds on a 2-core CPU, printed) is written
to a temporary directory unless ``--model-path`` names one. Requests are the same greedy
text-only chats on both sides, capped alike (``--max-tokens`` text tokens,
``--max-codes`` codec frames: a random talker rarely says end-of-speech).

- monolithic: ``Qwen3OmniMoeForConditionalGeneration.generate``, its best case under
  open load: whenever the model is free it takes every request that has arrived as one
  padded batch. Text and audio come back when the batch is done, so a request's first
  text and first audio are its completion.
- staged: ``topologies/qwen3-omni.yaml`` (real stage processes, ZeroMQ, shared memory),
  each request submitted at its arrival time.

Arrivals are Poisson at each rate (the same seeded schedule for both sides) for
``--seconds`` (at least ``--requests`` requests); times are from each request's arrival.
Rates default to multiples of the monolithic model's own capacity for one request at a
time (1 / its unloaded latency).

The first-audio target defaults to twice the monolithic unloaded latency (generous to
monolithic: it meets it until its queue builds). A side sustains a rate when its p90
first audio is within the target and no backlog is left when arrivals stop (the last
request done within twice the target of the last arrival). Goals (issue 14, goal 5), printed met / not met: staged
first audio (p50) <= 1/3 of monolithic's at every rate; the highest rate staged sustains
>= 2x monolithic's.

Also measured: the staged pipeline's first text and first audio at one request (nothing
else in flight; median of ``--single`` requests after the warm-up). ``--json PATH`` writes
every figure there, rewritten as each part finishes (a run stopped at its time limit keeps
what it measured).

Run: ``python benchmarks/qwen3_omni_open_loop.py [--quick]``; on a GPU, see
``benchmarks/qwen3_omni_gpu.sh`` (``--size real --device cuda``) and
``benchmarks/gpu_session.sh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCHMARKS = Path(__file__).resolve().parent
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable  # noqa: E402

from vs_transformers import Monolithic, make_request, staged_one, staged_topology  # noqa: E402


@dataclass
class Sample:
    first_text: float  # seconds from arrival
    first_audio: float
    total: float


@dataclass
class RateFigures:
    completed_per_s: float  # requests / (last completion - first arrival)
    samples: list[Sample]
    drain_s: float  # last completion - last arrival: a backlog left at the end shows here

    def pct(self, field: str, q: float) -> float:
        values = sorted(getattr(s, field) for s in self.samples)
        return values[min(len(values) - 1, int(q * len(values)))]

    def summary(self) -> dict[str, float]:
        """The figures the report prints, for ``--json``."""
        return {
            "requests": len(self.samples),
            "completed_per_s": self.completed_per_s,
            "drain_s": self.drain_s,
            "first_text_p50_s": self.pct("first_text", 0.5),
            "first_audio_p50_s": self.pct("first_audio", 0.5),
            "first_audio_p90_s": self.pct("first_audio", 0.9),
            "latency_p50_s": self.pct("total", 0.5),
        }


def arrivals(rate: float, count: int, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the start), the same for both sides."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


# --- monolithic -----------------------------------------------------------------------


def monolithic_open_loop(mono: Monolithic, schedule: list[float], max_batch: int) -> RateFigures:
    """Whenever the model is free, every request that has arrived becomes one batch."""
    started = time.perf_counter()
    pending = list(range(len(schedule)))
    done: dict[int, float] = {}
    while pending:
        now = time.perf_counter() - started
        ready = [i for i in pending if schedule[i] <= now][:max_batch]
        if not ready:
            time.sleep(max(0.0, schedule[pending[0]] - now))
            continue
        mono.generate(ready)
        finished = time.perf_counter() - started
        for i in ready:
            done[i] = finished
            pending.remove(i)
    samples = [Sample(done[i] - at, done[i] - at, done[i] - at) for i, at in enumerate(schedule)]
    last = max(done.values())
    return RateFigures(len(schedule) / (last - schedule[0]), samples, last - schedule[-1])


# --- staged ---------------------------------------------------------------------------


async def staged_open_loop(pipe: Any, schedule: list[float], max_tokens: int) -> RateFigures:
    started = time.perf_counter()
    finished: list[float] = []

    async def one(index: int, at: float) -> Sample:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
        first_text, first_audio, total = await staged_one(pipe, make_request(index, max_tokens))
        finished.append(time.perf_counter() - started)
        return Sample(first_text, first_audio, total)

    samples = await asyncio.gather(*(one(i, at) for i, at in enumerate(schedule)))
    last = max(finished)
    return RateFigures(len(schedule) / (last - schedule[0]), list(samples), last - schedule[-1])


async def staged_rates(model_path: str, device: str, schedules: dict[float, list[float]], args: Any,
                       results: dict[str, Any], save: Callable[[], None]) -> dict[float, RateFigures]:
    """Each rate on one launch of the staged pipeline; first the one-request figures
    (``results["staged_one"]``), after a warm-up."""
    import omnictl

    one_gpu = device.startswith("cuda") and _gpu_count() < 2
    topology = staged_topology(args.max_codes, args.stream_every, args.chunk_frames, one_gpu=one_gpu)
    figures: dict[float, RateFigures] = {}
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir or scratch  # the stage processes' logs land in <run_dir>/logs
        async with omnictl.Pipeline.launch(topology, model_path=model_path, device=device, run_dir=run_dir,
                                           profile=False) as pipe:
            results["stage_pids"] = pipe.process_ids()  # GPU memory per process, sampled by pid, is placed by these
            save()
            for i in range(2):  # warm-up
                await staged_one(pipe, make_request(i, args.max_tokens))
            singles = [await staged_one(pipe, make_request(i, args.max_tokens)) for i in range(args.single)]
            one = results["staged_one"] = {
                "requests": len(singles),
                "first_text_s": statistics.median(s[0] for s in singles),
                "first_audio_s": statistics.median(s[1] for s in singles),
                "total_s": statistics.median(s[2] for s in singles),
            }
            print(f"  staged, one request at a time (median of {len(singles)}): first text {one['first_text_s']:.3f} s, "
                  f"first audio {one['first_audio_s']:.3f} s, done {one['total_s']:.3f} s", flush=True)
            save()
            for rate, schedule in schedules.items():
                figures[rate] = await staged_open_loop(pipe, schedule, args.max_tokens)
                results["rates"].setdefault(str(rate), {})["staged"] = figures[rate].summary()
                save()
                print(f"  staged     {rate:6.2f} req/s done: first audio p50 {figures[rate].pct('first_audio', 0.5):.2f} s",
                      flush=True)
    return figures


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# --- the thinker's step ---------------------------------------------------------------


def thinker_step_ms(mono: Monolithic, threads: int) -> float:
    """One thinker decode step (batch 1, after a 40-token prompt), median of 20, at
    ``threads`` (the staged thinker's process gets the launcher's share of the cores)."""
    import torch

    thinker = mono.model.thinker
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ids = torch.randint(0, 400, (1, 40), device=mono.device)
        times = []
        with torch.inference_mode():
            out = thinker(input_ids=ids, use_cache=True)
            for _ in range(20):
                began = time.perf_counter()
                out = thinker(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
                if mono.device.startswith("cuda"):
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000
    finally:
        torch.set_num_threads(previous)


# --- report ---------------------------------------------------------------------------


def keeps_up(figures: RateFigures, target: float) -> bool:
    """p90 first audio within the target, and no backlog at the end: the last request
    done within twice the target of the last arrival."""
    return figures.pct("first_audio", 0.9) <= target and figures.drain_s <= 2 * target


def report(staged: dict[float, RateFigures], mono: dict[float, RateFigures], target: float,
           results: dict[str, Any]) -> bool:
    """Print the table and the goals; the sustained rates and the goals go into ``results``."""
    print(f"\nfirst-audio target: p90 <= {target:.2f} s")
    header = (f"{'offered/s':>9} | {'side':<10} | {'done/s':>6} | {'1st text p50':>12} | {'1st audio p50':>13} | "
              f"{'1st audio p90':>13} | {'latency p50':>11} | rate")
    print(header)
    print("-" * len(header))
    for rate in staged:
        for name, figures in (("staged", staged[rate]), ("monolithic", mono[rate])):
            p90 = figures.pct("first_audio", 0.9)
            print(f"{rate:9.2f} | {name:<10} | {figures.completed_per_s:6.2f} | {figures.pct('first_text', 0.5):10.2f} s | "
                  f"{figures.pct('first_audio', 0.5):11.2f} s | {p90:11.2f} s | {figures.pct('total', 0.5):9.2f} s | "
                  f"{'sustained' if keeps_up(figures, target) else 'not'}")
    ratios = {rate: staged[rate].pct("first_audio", 0.5) / mono[rate].pct("first_audio", 0.5) for rate in staged}
    worst = max(ratios.values())
    first_ok = worst <= 1 / 3
    print("\ngoal: staged first audio <= 1/3 of monolithic at every rate: "
          + ", ".join(f"{rate:g}/s {ratio:.2f}" for rate, ratio in ratios.items())
          + f" -> {'met' if first_ok else 'NOT met'} (worst {worst:.2f})")

    def sustained(figures: dict[float, RateFigures]) -> float:
        ok = [rate for rate, f in figures.items() if keeps_up(f, target)]
        return max(ok) if ok else 0.0

    s_rate, m_rate = sustained(staged), sustained(mono)
    top = max(staged)
    if m_rate == 0.0:
        rate_ok = s_rate > 0.0
        verdict = f"monolithic sustains none of the rates, staged {s_rate:g}/s"
    else:
        rate_ok = s_rate >= 2 * m_rate
        verdict = f"staged {s_rate:g}/s vs monolithic {m_rate:g}/s = {s_rate / m_rate:.2f}x"
    note = " (staged sustains the highest rate offered: offer more to find its limit)" if s_rate == top else ""
    print(f"goal: sustainable rate (p90 first audio within target, no backlog) staged >= 2x monolithic: {verdict} "
          f"-> {'met' if rate_ok else 'NOT met'}{note}")
    results["sustained_per_s"] = {"staged": s_rate, "monolithic": m_rate, "highest_offered": top}
    results["goals"] = {"staged_first_audio_third_of_monolithic": first_ok, "staged_rate_2x_monolithic": rate_ok}
    return first_ok and rate_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", help="a Qwen3-Omni checkpoint directory (default: write one of --size)")
    parser.add_argument("--size", default="mid", help="checkpoint size to write: tiny, mid or real (default: mid)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--rates", help="offered requests/s, comma-separated (default: --multiples of monolithic's "
                                        "one-at-a-time capacity)")
    parser.add_argument("--multiples", default="0.25,0.5,1,2,4",
                        help="rates as multiples of 1 / monolithic's unloaded latency (default 0.25,0.5,1,2,4)")
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per rate span this long (default 30)")
    parser.add_argument("--requests", type=int, default=8, help="at least this many requests per rate (default 8)")
    parser.add_argument("--target", type=float, help="p90 first-audio target in seconds (default: 2x monolithic's "
                                                     "unloaded latency)")
    parser.add_argument("--max-tokens", type=int, default=24, help="text tokens per request")
    parser.add_argument("--max-codes", type=int, default=32, help="codec frames per request")
    parser.add_argument("--max-batch", type=int, default=16, help="monolithic: largest batch")
    parser.add_argument("--stream-every", type=int, default=1, help="thinker: stream every N tokens")
    parser.add_argument("--chunk-frames", type=int, default=10, help="code2wav: frames per audio chunk")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--single", type=int, default=3,
                        help="staged: requests sent one at a time for the one-request figures (default 3)")
    parser.add_argument("--json", type=Path, help="write every figure to this file as it is measured")
    parser.add_argument("--run-dir", type=Path, help="the staged pipeline's run directory, kept (its stage "
                                                     "processes' logs: logs/); default a temporary one")
    parser.add_argument("--quick", action="store_true", help="two rates, 6 requests each (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.seconds = min(args.requests, 6), 0.0
    if args.single < 1:
        parser.error("--single must be at least 1")
    results: dict[str, Any] = {"device": args.device, "size": args.size, "max_tokens": args.max_tokens,
                               "max_codes": args.max_codes, "rates": {}}

    def save() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as scratch:
        model_path = args.model_path
        if model_path is None:
            from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint

            began = time.perf_counter()
            init = args.device if args.device.startswith("cuda") else "cpu"
            model_path = str(write_tiny_checkpoint(Path(scratch) / f"{args.size}-qwen3-omni", size=args.size,
                                                   device=init))
            print(f"wrote a {args.size} random-weight checkpoint in {time.perf_counter() - began:.1f} s", flush=True)
        mono = Monolithic(model_path, args.max_tokens, args.max_codes, device=args.device)
        params = sum(p.numel() for p in mono.model.parameters()) / 1e6
        share = max(1, (os.cpu_count() or 1) // 3)  # the launcher's split over the 3 processes
        print(f"checkpoint: {model_path} ({params:.0f} M parameters); {args.max_tokens} text tokens, "
              f"{args.max_codes} codec frames per request; device {args.device}")
        step_share, step_all = thinker_step_ms(mono, share), thinker_step_ms(mono, os.cpu_count() or 1)
        print(f"thinker decode step (batch 1): {step_share:.1f} ms at {share} thread(s) "
              f"(the staged thinker's share), {step_all:.1f} ms at every core "
              f"(monolithic)", flush=True)
        mono.generate([0])  # warm-up
        unloaded = statistics.median(mono.generate([i]) for i in range(2))
        print(f"monolithic unloaded latency: {unloaded:.2f} s", flush=True)
        target = args.target or 2 * unloaded
        results.update(model_path=model_path, params_m=params, thinker_step_ms=step_all, monolithic_pid=os.getpid(),
                       monolithic_unloaded_s=unloaded, target_p90_first_audio_s=target)
        save()
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
        else:
            multiples = (0.5, 2) if args.quick else tuple(float(m) for m in args.multiples.split(","))
            rates = [round(m / unloaded, 3) for m in multiples]
        schedules = {rate: arrivals(rate, max(args.requests, round(rate * args.seconds)), args.seed + i)
                     for i, rate in enumerate(rates)}

        mono_figures: dict[float, RateFigures] = {}
        for rate, schedule in schedules.items():
            mono_figures[rate] = monolithic_open_loop(mono, schedule, args.max_batch)
            results["rates"].setdefault(str(rate), {})["monolithic"] = mono_figures[rate].summary()
            save()
            print(f"  monolithic {rate:6.2f} req/s done: first audio p50 {mono_figures[rate].pct('first_audio', 0.5):.2f} s",
                  flush=True)
        del mono  # its memory back before the stage processes load their parts
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # and out of this process's cache: the memory samples show the stages alone
        staged_figures = asyncio.run(staged_rates(model_path, args.device, schedules, args, results, save))
    report(staged_figures, mono_figures, target, results)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
