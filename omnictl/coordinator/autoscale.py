"""When to add or remove a replica of an elastic process (`replicas: {min, max}`).

A plain object, fed the clock and what the coordinator's core holds (the requests in flight
on each replica; which replicas run, start or wait in standby); it returns decisions and
the shell carries them out: starting a standby replica, or draining one (it takes no new
request and is stopped once its last one ends). The figure a decision rests on is the
requests in flight per running replica of the process: every request pinned to it, queued
or running, which the coordinator knows without asking the stages.

- up: that figure stays above the process's ``queue`` for ``window`` seconds while fewer
  than ``max`` replicas run: as many are started at once as bring it back to ``queue`` (none
  while others are starting);
- down: more than ``min`` replicas run and the figure stays at or below half the ``queue``
  for ``idle`` seconds: as many replicas as that load leaves idle (at least one), those
  holding fewest requests, are drained (the requests they still hold complete there, then
  they stop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from omnictl.topology.model import ProcessSpec, Topology


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
        self._busy_since: dict[str, float] = {}  # process -> when its queue went past the threshold
        self._calm_since: dict[str, float] = {}  # process -> when its queue fell to half the threshold
        # what /metrics counts: decisions by process and direction
        self.counts: dict[tuple[str, str], int] = {(p.name, d): 0 for p in self.processes for d in ("up", "down")}

    def decide(
        self,
        now: float,
        in_flight: Mapping[str, int],
        running: Mapping[str, Sequence[str]],
        standby: Collection[str],
        starting: Collection[str],
    ) -> list[ScaleDecision]:
        """``running``: per elastic process, its replicas that take requests (up, not
        draining); ``standby``: replicas not running; ``starting``: standby replicas being
        started."""
        decisions: list[ScaleDecision] = []
        for process in self.processes:
            elastic = process.elastic
            assert elastic is not None
            live = list(running.get(process.name, ()))
            pending = any(name in starting for name in process.instances)
            load = sum(in_flight.get(name, 0) for name in live) / len(live) if live else 0.0
            free = [name for name in process.instances if name in standby and name not in starting]
            if load > elastic.queue and free and not pending:
                since = self._busy_since.setdefault(process.name, now)
                if now - since >= elastic.window:
                    del self._busy_since[process.name]
                    why = (
                        f"{load:.1f} requests in flight per replica for {now - since:.1f}s "
                        f"(above {elastic.queue:g} for {elastic.window:g}s)"
                    )
                    # as many as bring the figure back to the threshold, at once (a ramp one
                    # replica per window would leave a burst queued for several windows)
                    total = sum(in_flight.get(name, 0) for name in live)
                    wanted = max(1, math.ceil(total / elastic.queue) - len(live))
                    for name in free[:wanted]:
                        decisions.append(ScaleDecision(process.name, name, True, load, why))
            else:
                self._busy_since.pop(process.name, None)
            calm = load <= elastic.queue / 2 and len(live) > elastic.min and not pending
            if not calm:
                self._calm_since.pop(process.name, None)
                continue
            since = self._calm_since.setdefault(process.name, now)
            if now - since >= elastic.idle:
                del self._calm_since[process.name]
                # As many as the load allows at once (back to `min` within one idle window when
                # nothing runs), those holding least first (the highest-numbered of equals):
                # their requests end soonest.
                total = sum(in_flight.get(name, 0) for name in live)
                needed = max(elastic.min, math.ceil(total / (elastic.queue / 2)))
                why = (
                    f"{load:.1f} requests in flight per replica for {now - since:.1f}s "
                    f"(at most {elastic.queue / 2:g}, half the threshold, for the idle window {elastic.idle:g}s)"
                )
                fewest = sorted(reversed(live), key=lambda n: in_flight.get(n, 0))
                for name in fewest[: max(1, len(live) - needed)]:
                    decisions.append(ScaleDecision(process.name, name, False, load, why))
        for decision in decisions:
            self.counts[(decision.process, "up" if decision.up else "down")] += 1
        return decisions
