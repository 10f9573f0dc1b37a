"""Elastic replicas: a load step (low -> high -> low) against `replicas: {min: 1, max: 4}`,
side by side with a fixed 1 and a fixed 4 replicas, in one run.

The pipeline: ``front`` (identity) -> ``work`` (waits ``--work-ms`` per request with the GIL
released, standing in for an accelerator kernel; the process that scales) -> result.
Open-loop arrivals at a fixed rate per phase: low (a fifth of one replica's capacity), high
(about three replicas' worth), low again. Printed per setting: replica count, requests in
flight and p50 / p99 latency per phase, and a timeline (every second: replicas, in flight).

Goals (from the issue): during the high phase the elastic p99 within 1.5x of fixed 4's; in
the last low phase back to ``min`` replicas within the idle window (counted from the moment
the high phase's requests have drained); 0 requests failed.

Where the step's cost comes from, printed for each elastic run: when the high phase started,
when the scale-up decision fired and each replica answered (the coordinator's log lines, in
seconds into the phase), how many of the phase's requests were moved to a new replica (and
how often: at most once each), how many of the late ones (over 1.5x fixed 4's p99) stayed
where they were pinned at submit, and for each request of the phase's first 0.5 s the
replica it was pinned to, any move and its latency. ``--window-s`` takes several windows:
one elastic run each, side by side with the same fixed runs. ``--rounds N`` repeats the
elastic runs and fixed 4 N times and judges the goal on the median of the rounds' ratios:
on shared cores one noisy minute (another job's burst) can spoil a setting's p99, and the
ratio then says more about the machine than about the autoscaler.

The autoscaler's window: 0.05 s and 0.1 s here by default, one elastic run each (the
topology's default is 0.5 s). A replica the autoscaler adds is forked from a preloaded
template and takes requests 40-170 ms after the decision on these cores, so the window is
most of the reaction time, and a short one costs little when it fires on a burst (the idle
window takes the replica back; at 60 requests/s 0.05 s is 3 arrivals past the threshold).
Whatever reacts after a step leaves that long's arrivals queued (40/s more than one replica
serves here) and the four replicas then drain it at only 20/s, so every 0.1 s of reaction
makes about 0.3 s of arrivals late: that, not where the backlog waits, is what the whole high
phase's p99 (the goal) holds against fixed 4. The load shape is the same for every setting;
the p99 is printed whole and, for information, over the arrivals past the high phase's first
1, 2 and 5 s (the step's backlog left out).

Run: ``python benchmarks/elastic.py [--low-s 6] [--high-s 12] [--work-ms 50] [--window-s 0.05 0.1 ...] [--rounds 1] [--idle-s 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: benchmarks.* imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.exceptions import RequestError
from omnictl.pipeline import Pipeline

E = "omnictl.models.examples"
P99_GOAL = 1.5
RAMP_S = (1.0, 2.0, 5.0)  # the high phase's first seconds, left out of the informational after-ramp p99s


@dataclass
class Phase:
    name: str
    rate: float  # arrivals per second
    seconds: float
    latencies: list[float] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # seconds into the phase, beside each latency
    replicas: list[int] = field(default_factory=list)  # sampled
    in_flight: list[int] = field(default_factory=list)  # sampled

    def quantile(self, q: float, after: float = 0.0) -> float:
        """Over the requests that arrived ``after`` seconds into the phase or later."""
        ordered = sorted(lat for lat, at in zip(self.latencies, self.arrived) if at >= after)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Run:
    label: str
    phases: list[Phase]
    failed: int
    timeline: list[tuple[float, int, int]]  # (seconds into the run, replicas running, requests in flight)
    back_to_min_s: float | None  # last phase: seconds from the high phase's drain to `min` replicas
    decisions: list[str] = field(default_factory=list)  # the autoscaler's, as logged, with seconds into the high phase
    trail: dict[int, Trail] = field(default_factory=dict)  # per high-phase request: where it waited and ran


@dataclass
class Trail:
    """Where one high-phase request went: the replica it was pinned to at submit, and each
    move (seconds into the high phase, the replica it was re-placed on)."""

    arrived: float
    first: str
    moves: list[tuple[float, str]] = field(default_factory=list)
    latency: float = float("nan")


def topology(directory: Path, replicas: Any, work_s: float) -> Path:
    stages = [
        {"name": "front", "factory": f"{E}.identity", "next": ["work"]},
        {"name": "work", "factory": f"{E}.sleep", "factory_args": {"seconds": work_s}, "terminal": True},
    ]
    label = replicas if isinstance(replicas, int) else "elastic"
    path = directory / f"elastic-{label}.yaml"
    document = {"name": f"work-{label}", "stages": stages, "processes": {"work": {"replicas": replicas}}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _running(pipe: Pipeline) -> int:
    scaling = pipe.scaling()
    if "work" in scaling:
        return scaling["work"]["replicas"]
    _, down = pipe.health()
    return sum(1 for name in pipe.topology.processes["work"].instances if name not in down)


class _Decisions(logging.Handler):
    """The coordinator's scaling log lines, kept with when they came."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.origin = time.perf_counter()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("scaling process", "replica ")):
            self.lines.append(f"{time.perf_counter() - self.origin:+6.3f}s {message}")


async def measure(label: str, path: Path, phases: list[Phase], minimum: int) -> Run:
    decisions = _Decisions()
    coordinator_log = logging.getLogger("omnictl.coordinator.coordinator")
    coordinator_log.addHandler(decisions)
    coordinator_log.setLevel(logging.INFO)
    try:
        run = await _measure(label, path, phases, minimum, decisions)
    finally:
        coordinator_log.removeHandler(decisions)
    run.decisions = decisions.lines
    return run


async def _measure(label: str, path: Path, phases: list[Phase], minimum: int, decisions: _Decisions) -> Run:
    async with Pipeline.launch(path, profile=False, request_timeout=120.0) as pipe:
        failed = 0
        pending: set[asyncio.Task[None]] = set()
        timeline: list[tuple[float, int, int]] = []
        origin = decisions.origin = time.perf_counter()
        current: list[Phase] = [phases[0]]
        trail: dict[int, Trail] = {}
        ids: dict[str, int] = {}  # request id -> its number, for the high phase's requests
        core = pipe._coordinator.core  # instrumented: where each request is placed and moved
        work = pipe.topology.processes["work"]
        take_replays = core.take_replays

        def traced_take_replays() -> list[Any]:
            placed = take_replays()
            for admitted in placed:
                number = ids.get(admitted.record.request_id)
                if number is not None:
                    where = work.instances[admitted.context.replicas.get("work", 0)]
                    trail[number].moves.append((time.perf_counter() - decisions.origin, where))
            return placed

        core.take_replays = traced_take_replays  # type: ignore[method-assign]

        async def one(phase: Phase, i: int, at: float) -> None:
            nonlocal failed
            begin = time.perf_counter()
            try:
                handle = await pipe.submit({"i": i})
                if phase is phases[1]:
                    ids[handle.id] = i
                    trail[i] = Trail(at, core.placement._assigned[handle.id]["work"])
                await handle.result()
            except RequestError:
                failed += 1
                return
            phase.latencies.append(time.perf_counter() - begin)
            phase.arrived.append(at)
            if i in trail:
                trail[i].latency = phase.latencies[-1]

        async def sample() -> None:
            tick = 0
            while True:
                await asyncio.sleep(0.25)
                running, flying = _running(pipe), pipe.admission.in_flight
                current[0].replicas.append(running)
                current[0].in_flight.append(flying)
                tick += 1
                if tick % 4 == 0:
                    timeline.append((time.perf_counter() - origin, running, flying))

        async def back_to_min(high: list[asyncio.Task[None]]) -> float | None:
            """Seconds from when the high phase's requests had all ended to `min` replicas."""
            await asyncio.gather(*high)
            drained = time.perf_counter()
            while time.perf_counter() < drained + 30.0:
                if _running(pipe) <= minimum:
                    return time.perf_counter() - drained
                await asyncio.sleep(0.1)
            return None

        sampler = asyncio.create_task(sample())
        count = 0
        for phase in phases:
            current[0] = phase
            start = time.perf_counter()
            if phase is phases[1]:  # from here on the log's times are seconds into the high phase
                decisions.lines.append(f"{start - decisions.origin:+6.3f}s the high phase starts")
                decisions.origin = start
            for k in range(int(phase.rate * phase.seconds)):
                await asyncio.sleep(max(0.0, start + k / phase.rate - time.perf_counter()))
                task = asyncio.create_task(one(phase, count, k / phase.rate))
                pending.add(task)
                task.add_done_callback(pending.discard)
                count += 1
            # the phase lasts its seconds: its last arrival is one interval before the next
            # phase's first, not at the same instant (which queued the step's first request
            # behind the low phase's last on the one replica running)
            await asyncio.sleep(max(0.0, start + phase.seconds - time.perf_counter()))
            if phase is phases[1]:
                # the high phase's backlog drains into the next phase: the idle clock starts after it
                watcher = asyncio.create_task(back_to_min(list(pending)))
        await asyncio.gather(*list(pending))
        back = await watcher
        sampler.cancel()
    return Run(label, phases, failed, timeline, back, trail=trail)


def _phases(args: argparse.Namespace) -> list[Phase]:
    capacity = 1.0 / (args.work_ms / 1000.0)  # requests/s one replica serves
    return [Phase("low", capacity * 0.2, args.low_s), Phase("high", capacity * 3.0, args.high_s),
            Phase("low", capacity * 0.2, args.low_s + args.idle_s * 2)]


def render(runs: list[Run], idle_s: float) -> str:
    lines = []
    header = f"  {'setting':<22} {'phase':<6} {'req/s':>6} {'replicas':>14} {'in flight':>14} {'p50':>8} {'p99':>8}"
    lines.append(header)
    for run in runs:
        for phase in run.phases:
            reps = f"{min(phase.replicas, default=0)}-{max(phase.replicas, default=0)}"
            flying = f"{sum(phase.in_flight) / max(1, len(phase.in_flight)):.1f} (max {max(phase.in_flight, default=0)})"
            lines.append(f"  {run.label:<22} {phase.name:<6} {phase.rate:>6.1f} {reps:>14} {flying:>14} "
                         f"{phase.quantile(0.5) * 1000:>6.0f}ms {phase.quantile(0.99) * 1000:>6.0f}ms")
        lines.append(f"  {run.label:<22} failed {run.failed}")
    for run in runs:
        lines.append(f"  timeline {run.label} (s: replicas/in flight): "
                     + " ".join(f"{t:.0f}:{r}/{f}" for t, r, f in run.timeline))
    fixed4 = runs[-1]
    reference = fixed4.phases[1].quantile(0.99)
    for elastic in (run for run in runs if run.label.startswith("elastic")):
        lines.extend(_goals(elastic, reference, idle_s))
    failed = sum(run.failed for run in runs)
    lines.append(f"  failed requests: {failed} (goal 0): {'met' if failed == 0 else 'not met'}")
    return "\n".join(lines)


def _goals(elastic: Run, reference: float, idle_s: float) -> list[str]:
    """The issue's goals for one elastic setting, against fixed 4's high-phase p99 (``reference``)."""
    high = elastic.phases[1]
    ratio = high.quantile(0.99) / reference
    lines = [f"  {elastic.label}: high phase p99 {high.quantile(0.99) * 1000:.0f} ms vs fixed 4 {reference * 1000:.0f} ms "
             f"= {ratio:.2f}x (goal <= {P99_GOAL}x): {'met' if ratio <= P99_GOAL else 'not met'}"]
    for after in RAMP_S:
        lines.append(f"    (for information) p99 of arrivals after the high phase's first {after:g} s (the step's backlog "
                     f"left out): {high.quantile(0.99, after) * 1000:.0f} ms = {high.quantile(0.99, after) / reference:.2f}x "
                     f"fixed 4's whole-phase p99")
    at_max = next((i * 0.25 for i, n in enumerate(high.replicas) if n == max(high.replicas, default=0)), 0.0)
    lines.append(f"    {max(high.replicas, default=0)} replicas {at_max:.2f} s into the high phase (sampled every 0.25 s); "
                 f"requests over 1.5x fixed 4's p99: {sum(1 for lat in high.latencies if lat > P99_GOAL * reference)} "
                 f"of {len(high.latencies)} (the p99 allows {len(high.latencies) // 100})")
    lines.extend(f"    decision {line}" for line in elastic.decisions)
    lines.extend(_trail(elastic, P99_GOAL * reference))
    back = elastic.back_to_min_s
    lines.append(f"    back to min after the high phase drained: "
                 f"{'never (30 s)' if back is None else f'{back:.1f} s'} (goal <= idle window {idle_s:g} s + 1 s of ticks): "
                 f"{'met' if back is not None and back <= idle_s + 1.0 else 'not met'}")
    return lines


def _trail(run: Run, late_s: float) -> list[str]:
    """Where the high phase's late requests (over ``late_s``) waited and whether they moved."""
    late = [t for t in run.trail.values() if t.latency > late_s]
    if not run.trail:
        return []
    lines = [f"    {len(late)} high-phase request(s) over {late_s * 1000:.0f} ms (1.5x fixed 4's p99): arrived "
             + (f"{min(t.arrived for t in late) * 1000:.0f}-{max(t.arrived for t in late) * 1000:.0f} ms into the "
                f"phase; {sum(1 for t in late if t.moves)} of them moved, "
                f"{sum(1 for t in late if not t.moves)} stayed where pinned at submit" if late else "none")]
    moved = [t for t in run.trail.values() if t.moves]
    lines.append(f"    {len(moved)} high-phase request(s) moved to a new replica, "
                 f"{sum(len(t.moves) for t in moved)} move(s) in all")
    early = sorted((t for t in run.trail.values() if t.arrived < 0.5), key=lambda t: t.arrived)
    lines.append("    the first 0.5 s of the high phase (arrived ms: pinned at submit [-> moved at ms to replica] "
                 "= latency ms): " + "; ".join(
                     f"{t.arrived * 1000:.0f}: {t.first}" + "".join(f" -> {at * 1000:.0f} {where}" for at, where in t.moves)
                     + f" = {t.latency * 1000:.0f}" for t in early))
    return lines


async def main_async(args: argparse.Namespace) -> list[list[Run]]:
    """``args.rounds`` rounds, each every elastic window then fixed 4 (fixed 1 in the first
    only, before fixed 4): a noisy minute on shared cores spoils one round, not the figure."""
    work_s = args.work_ms / 1000.0
    rounds: list[list[Run]] = []
    with tempfile.TemporaryDirectory(prefix="omnictl-elastic-") as tmp:
        directory = Path(tmp)
        for round_ in range(args.rounds):
            runs = []
            for window in args.window_s:
                elastic = {"min": 1, "max": 4, "queue": args.queue, "window": window, "idle": args.idle_s}
                path = topology(directory, elastic, work_s)
                runs.append(await measure(f"elastic (window {window:g} s)", path, _phases(args), 1))
            for fixed in (1, 4) if round_ == 0 else (4,):  # fixed 4 last: the reference
                runs.append(await measure(f"fixed {fixed}", topology(directory, fixed, work_s), _phases(args), fixed))
            rounds.append(runs)
    return rounds


def summary(rounds: list[list[Run]]) -> list[str]:
    """Per elastic window: the whole-high-phase p99 ratio to fixed 4's in each round, and
    their median (the goal's figure)."""
    lines = []
    for index, first in enumerate(run for run in rounds[0] if run.label.startswith("elastic")):
        ratios = [runs[index].phases[1].quantile(0.99) / runs[-1].phases[1].quantile(0.99) for runs in rounds]
        median = statistics.median(ratios)
        lines.append(f"  {first.label}: whole high phase p99 / fixed 4's, per round: "
                     f"{', '.join(f'{r:.2f}x' for r in ratios)}; median {median:.2f}x (goal <= {P99_GOAL}x): "
                     f"{'met' if median <= P99_GOAL else 'not met'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low-s", type=float, default=6.0, help="seconds of each low phase (the last one gets 2 idle windows more)")
    parser.add_argument("--high-s", type=float, default=12.0, help="seconds of the high phase")
    parser.add_argument("--work-ms", type=float, default=50.0, help="what the scaled stage waits per request")
    parser.add_argument("--queue", type=float, default=2.0, help="the autoscaler's threshold: requests in flight per replica")
    parser.add_argument("--window-s", type=float, nargs="+", default=[0.05, 0.1],
                        help="seconds past the threshold before a replica is added; several: one elastic run each")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the elastic runs beside fixed 4 (the goal is judged on the median ratio)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="the idle window: seconds calm before replicas are drained")
    args = parser.parse_args()
    rounds = asyncio.run(main_async(args))
    windows = ", ".join(f"{w:g}" for w in args.window_s)
    print(f"elastic replicas: min 1, max 4 (queue {args.queue:g}, window {windows} s, idle {args.idle_s:g} s) "
          f"vs fixed 1 and fixed 4; work {args.work_ms:g} ms per request; {args.rounds} round(s)")
    for number, runs in enumerate(rounds, 1):
        print(f" round {number}:")
        print(render(runs, args.idle_s))
    print("\n".join(summary(rounds)))


if __name__ == "__main__":
    main()
