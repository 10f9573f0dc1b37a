"""``Pipeline.stats()``: the stats replies of every replica, per stage."""

from __future__ import annotations

from typing import Any, Container, Iterable, Mapping

import msgspec

from omnictl import messages as m
from omnictl.topology.model import Topology


def stage_stats(
    topology: Topology, replies: Mapping[str, m.StatsReply], down: Container[str], standby: Container[str] = ()
) -> dict[str, dict[str, Any]]:
    """Per stage: status, its process, and the state counters summed over the replicas that
    answered; for a replicated process, ``replicas`` has the same per OS process (``tts#0``, ...). Status: ``up``,
    ``down`` (every replica), ``degraded`` (some replica down) or ``unknown`` (no answer). A
    ``standby`` replica of an elastic process (not running by design) counts for none."""
    result: dict[str, dict[str, Any]] = {}
    for process, spec in topology.processes.items():
        for stage in spec.stages:
            per_replica = {
                name: {"status": "standby"} if name in standby else _replica(name, replies.get(name), stage, down)
                for name in spec.instances
            }
            entry = result[stage] = {
                "status": _combined([r["status"] for r in per_replica.values() if r["status"] != "standby"]),
                "process": process,
                **_summed(per_replica.values()),
            }
            if spec.replicas > 1:
                entry["replicas"] = per_replica
            if topology.multi_node():  # where it runs: its `node` label ("-": the coordinator's machine)
                entry["node"] = spec.node or "-"
    return result


def node_stats(topology: Topology, down: Container[str], standby: Container[str] = ()) -> dict[str, dict[str, Any]]:
    """Per node label (``-``: the coordinator's machine): ``up`` when every OS process placed
    there is up, ``down`` when none is, else ``degraded``; with those processes."""
    result: dict[str, dict[str, Any]] = {}
    for spec in topology.processes.values():
        entry = result.setdefault(spec.node or "-", {"processes": []})
        entry["processes"].extend(name for name in spec.instances if name not in standby)
    for entry in result.values():
        entry["status"] = _combined(["down" if name in down else "up" for name in entry["processes"]])
    return result


def _replica(instance: str, reply: m.StatsReply | None, stage: str, down: Container[str]) -> dict[str, Any]:
    status = "down" if instance in down else ("up" if reply else "unknown")
    fields = msgspec.structs.asdict(reply.stages[stage]) if reply else {}
    if not fields.get("rank_kv_slots"):
        fields.pop("rank_kv_slots", None)  # only tensor-parallel stages have follower ranks
    return {"status": status, **fields}


def _combined(statuses: list[str]) -> str:
    if all(s == "down" for s in statuses):
        return "down"
    if "down" in statuses:
        return "degraded"
    return "up" if all(s == "up" for s in statuses) else "unknown"


def _summed(replicas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counters summed (lists, like ``rank_kv_slots``, joined); ``busy_s`` (one step's
    duration) is the longest of the replicas'."""
    total: dict[str, Any] = {}
    for fields in replicas:
        for key, value in fields.items():
            if key == "busy_s":
                total[key] = max(total.get(key, 0.0), value)
            elif key != "status":
                total[key] = total.get(key, type(value)()) + value
    return total
