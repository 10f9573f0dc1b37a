"""When to add or remove a replica of an elastic process (`replicas: {min, max}`).

A plain object, fed the clock and what the coordinator's core holds (the requests in flight
on each replica; which replicas run, start or wait in standby); it returns decisions and
the shell carries them out: starting a standby replica, or draining one (it takes no new
request and is stopped once its last one ends). The figure a decision rests on is the
requests in flight per running replica of the process: every request pinned to it, queued
or running, which the coordinator knows without asking the stages.

- up: that figure stays above the process's ``queue`` for ``window`` seconds while fewer
  than ``max`` replicas run: as many are started at once as the larger of two counts needs
  (none while others are starting): the replicas that bring the figure back to ``queue``,
  and those that serve the arrival rate seen over the window at no more than
  ``TARGET_UTILISATION`` of the rate a replica served meanwhile (it was saturated: past the
  threshold). The second is what a step in load needs when the window is short: the queue
  is still small, its growth is not;
- down: more than ``min`` replicas run and the figure stays at or below half the ``queue``
  for ``idle`` seconds: as many replicas as that load leaves idle, those holding fewest
  requests, are drained (the requests they still hold complete there, then they stop).
  Once a scale-up has measured what one saturated replica serves, the replicas kept are
  instead those that serve the arrival rate of the idle window at no more than
  ``TARGET_UTILISATION`` of that and would hold no more than ``queue`` each (checked every
  tick once calm for the window, so replicas go one by one as the window slides past a
  busy phase):
  a short queue does not mean idle replicas (four replicas at three quarters load each
  hold one request or less), and draining one there would push the rest past the
  threshold again (flapping). Without that figure, one replica at least is drained.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from omnictl.topology.model import ProcessSpec, Topology

# The load a scale-up sizes for and a scale-down may leave on each replica kept: past ~80 %
# a replica's queue (and its latency) grows steeply, and the up trigger would fire again.
TARGET_UTILISATION = 0.8


@dataclass(frozen=True)
class ScaleDecision:
    process: str
    instance: str  # the replica to start (up) or to drain (down)
    up: bool
    figure: float  # requests in flight per running replica of the process
    why: str  # one sentence with the figure and the threshold, for the log


class Autoscaler:
    def __init__(self, topology: Topology) -> None:
        self.processes: list[ProcessSpec] = [p for p in topology.processes.values() if p.elastic is not None]
        # process -> when its queue went past the threshold, and its (pinned, released) then
        self._busy_since: dict[str, tuple[float, int, int]] = {}
        self._calm_since: dict[str, float] = {}  # process -> when its queue fell to half the threshold
        # process -> (time, requests pinned so far) over the last idle window: its arrival rate
        self._arrivals: dict[str, deque[tuple[float, int]]] = {p.name: deque() for p in self.processes}
        self._served: dict[str, float] = {}  # process -> requests/s one saturated replica served (last scale-up)
        # what /metrics counts: decisions by process and direction
        self.counts: dict[tuple[str, str], int] = {(p.name, d): 0 for p in self.processes for d in ("up", "down")}

    def decide(
        self,
        now: float,
        in_flight: Mapping[str, int],
        running: Mapping[str, Sequence[str]],
        standby: Collection[str],
        starting: Collection[str],
        flow: Mapping[str, Sequence[int]] | None = None,
    ) -> list[ScaleDecision]:
        """``running``: per elastic process, its replicas that take requests (up, not
        draining); ``standby``: replicas not running; ``starting``: standby replicas being
        started; ``flow``: per replica, the requests pinned to it and released by it so far
        (:attr:`ReplicaPlacement.flow`; without it, only the queue sizes a scale-up)."""
        decisions: list[ScaleDecision] = []
        for process in self.processes:
            elastic = process.elastic
            assert elastic is not None
            live = list(running.get(process.name, ()))
            pending = any(name in starting for name in process.instances)
            load = sum(in_flight.get(name, 0) for name in live) / len(live) if live else 0.0
            free = [name for name in process.instances if name in standby and name not in starting]
            if flow is not None:
                samples = self._arrivals[process.name]
                samples.append((now, _flow(process, flow)[0]))
                while len(samples) > 1 and samples[1][0] <= now - elastic.idle:
                    samples.popleft()  # the oldest kept is at or before the window's start
            if load > elastic.queue and free and not pending:
                arrived, left = _flow(process, flow)
                since, arrived_then, left_then = self._busy_since.setdefault(process.name, (now, arrived, left))
                if now - since >= elastic.window:
                    del self._busy_since[process.name]
                    span = now - since
                    why = (
                        f"{load:.1f} requests in flight per replica for {span:.1f}s "
                        f"(above {elastic.queue:g} for {elastic.window:g}s)"
                    )
                    # as many as bring the figure back to the threshold, at once (a ramp one
                    # replica per window would leave a burst queued for several windows)
                    total = sum(in_flight.get(name, 0) for name in live)
                    wanted = max(1, math.ceil(total / elastic.queue) - len(live))
                    if span > 0 and left > left_then and live:
                        arriving = (arrived - arrived_then) / span
                        served = (left - left_then) / span / len(live)  # per replica, saturated
                        self._served[process.name] = served
                        # at the utilisation a scale-down keeps: sized for 100 %, the queue
                        # keeps growing at the first wobble and a second decision follows a
                        # start later (what a short window's low arrival count leads to)
                        needed = math.ceil(arriving / (served * TARGET_UTILISATION) - 1e-9)
                        why += (
                            f"; {arriving:.1f} arriving/s, {served:.1f}/s served per replica: {needed} needed "
                            f"at most {TARGET_UTILISATION:.0%} busy"
                        )
                        wanted = max(wanted, needed - len(live))
                    for name in free[:wanted]:
                        decisions.append(ScaleDecision(process.name, name, True, load, why))
            else:
                self._busy_since.pop(process.name, None)
            calm = load <= elastic.queue / 2 and len(live) > elastic.min and not pending
            if not calm:
                self._calm_since.pop(process.name, None)
                continue
            since = self._calm_since.setdefault(process.name, now)
            if now - since < elastic.idle:
                continue
            # As many as the load allows at once (back to `min` within one idle window when
            # nothing runs), those holding least first (the highest-numbered of equals):
            # their requests end soonest.
            total = sum(in_flight.get(name, 0) for name in live)
            needed = max(elastic.min, math.ceil(total / (elastic.queue / 2)))
            why = (
                f"{load:.1f} requests in flight per replica for {now - since:.1f}s "
                f"(at most {elastic.queue / 2:g}, half the threshold, for the idle window {elastic.idle:g}s)"
            )
            capacity = self._served.get(process.name)
            rate = self._arrival_rate(process.name)
            if capacity is None or rate is None:
                del self._calm_since[process.name]  # one at least, then a whole idle window again
                drained = max(1, len(live) - needed)
            else:
                # what the idle window's arrivals need, checked every tick from now on: as the
                # window slides past a busy phase, the replicas it leaves idle go one by one
                # the replicas kept serve the rate, and take what the drained ones hold no
                # further than the threshold (those still end where they are)
                by_queue = math.ceil(total / elastic.queue)
                needed = max(elastic.min, by_queue, math.ceil(rate / (capacity * TARGET_UTILISATION) - 1e-9))
                why += (
                    f"; {rate:.1f} arriving/s, {capacity:.1f}/s a replica serves: {needed} kept "
                    f"at most {TARGET_UTILISATION:.0%} busy"
                )
                drained = len(live) - needed
            fewest = sorted(reversed(live), key=lambda n: in_flight.get(n, 0))
            for name in fewest[: max(0, drained)]:
                decisions.append(ScaleDecision(process.name, name, False, load, why))
        for decision in decisions:
            self.counts[(decision.process, "up" if decision.up else "down")] += 1
        return decisions

    def _arrival_rate(self, process: str) -> float | None:
        """Requests/s pinned to ``process`` over the last idle window (None: not yet seen)."""
        samples = self._arrivals[process]
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return None
        return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])


def _flow(process: ProcessSpec, flow: Mapping[str, Sequence[int]] | None) -> tuple[int, int]:
    """The requests pinned to and released by every replica of ``process`` so far."""
    if flow is None:
        return 0, 0
    counts = [flow.get(name, (0, 0)) for name in process.instances]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)
