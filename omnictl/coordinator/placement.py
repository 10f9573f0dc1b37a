"""Which replica of each process serves each request.

A request is pinned, at submit, to one replica of every process its active stages run in:
the replica with the fewest requests in flight, skipping replicas that are down. The
choice of each replicated process travels in the request's :class:`RequestContext`
(``replicas``), so every hop, stream chunk and fan-in part reaches the same replica and a
request never spans two replicas of one process.
"""

from __future__ import annotations

from typing import Container, Iterable, Mapping

from omnictl.exceptions import PipelineDead
from omnictl.topology.model import ProcessSpec, Topology


class ReplicaPlacement:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.in_flight: dict[str, int] = {name: 0 for name in topology.instances()}
        # (pinned, released) so far per replica: the autoscaler's arrival and service rates
        self.flow: dict[str, list[int]] = {name: [0, 0] for name in topology.instances()}
        self._assigned: dict[str, dict[str, str]] = {}  # request id -> process -> replica name
        self._turn: dict[str, int] = {name: 0 for name in topology.processes}  # tie-break rotation
        self._by_active: dict[tuple[str, ...], list[ProcessSpec]] = {}

    def _processes(self, active: Iterable[str]) -> list[ProcessSpec]:
        key = tuple(active)
        processes = self._by_active.get(key)
        if processes is None:  # computed once per set of active stages, not per request
            names = dict.fromkeys(self.topology.process_of(stage) for stage in key)
            processes = self._by_active[key] = [self.topology.processes[name] for name in names]
        return processes

    def _pick(self, process: ProcessSpec, down: Container[str], prefer: str | None = None) -> int:
        up = [i for i, name in enumerate(process.instances) if name not in down]
        if prefer is not None and prefer in process.instances and prefer not in down:
            return process.instances.index(prefer)  # a new replica taking its share of the backlog
        if not up:
            which = "every replica of process" if process.replicas > 1 else "process"
            raise PipelineDead(f"{which} {process.name!r} (stages {', '.join(process.stages)}) is down")
        # Ties rotate, so light load spreads over the replicas too.
        turn = self._turn[process.name]
        self._turn[process.name] = turn + 1
        count = process.replicas
        return min(up, key=lambda i: (self.in_flight[process.instances[i]], (i - turn) % count))

    def assign(
        self,
        request_id: str,
        active: Iterable[str],
        down: Container[str],
        prefer: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """Pin ``request_id`` to one replica of every process it touches (``prefer``: process
        -> the replica to take when it is up); returns the index chosen for each replicated
        process (what the RequestContext carries). Raises :class:`PipelineDead` when some
        process it needs has no replica up."""
        chosen: dict[str, str] = {}
        indices: dict[str, int] = {}
        for process in self._processes(active):
            index = self._pick(process, down, prefer.get(process.name) if prefer else None)
            chosen[process.name] = process.instances[index]
            if process.replicas > 1:
                indices[process.name] = index
        for name in chosen.values():
            self.in_flight[name] += 1
            self.flow[name][0] += 1
        self._assigned[request_id] = chosen
        return indices

    def release(self, request_id: str) -> None:
        for name in self._assigned.pop(request_id, {}).values():
            self.in_flight[name] -= 1
            self.flow[name][1] += 1

    def holders(self, instance: str) -> list[str]:
        """The requests pinned to the OS process ``instance``, in submit order."""
        return [rid for rid, chosen in self._assigned.items() if instance in chosen.values()]

    def placed(self) -> int:
        """How many requests are pinned (0 once every request has ended)."""
        return len(self._assigned)
