"""``Pipeline.stats()`` and ``nodes()`` as the coordinator assembles them from its replies."""

from __future__ import annotations

from omnictl import messages as m
from omnictl.coordinator.stats import node_stats, stage_stats
from omnictl.topology import loads

TOPOLOGY = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: rep, next: [c]}
  - {name: c, factory: m.c, process: rep, terminal: true}
processes:
  rep: {replicas: 2}
"""

LABELLED = """
stages:
  - {name: a, factory: m.a, next: [b]}
  - {name: b, factory: m.b, process: far, terminal: true}
processes:
  far: {node: gpu-box, replicas: 2}
"""


def reply(process: str, **per_stage: m.StageStats) -> m.StatsReply:
    return m.StatsReply(process, 0, per_stage)


def test_counters_are_summed_over_replicas_and_busy_is_the_longest() -> None:
    replies = {
        "a": reply("a", a=m.StageStats(requests=1, queued=1)),
        "rep#0": reply("rep#0", b=m.StageStats(requests=2, running=2, kv_slots=3, busy_s=0.5),
                       c=m.StageStats(stream_buffers=1)),
        "rep#1": reply("rep#1", b=m.StageStats(requests=1, running=1, slots_in_use=4, busy_s=1.5),
                       c=m.StageStats()),
    }
    stats = stage_stats(loads(TOPOLOGY), replies, down=set())
    assert stats["a"] == {"status": "up", "process": "a", "requests": 1, "fanin_buffers": 0, "queued": 1,
                          "running": 0, "stream_buffers": 0, "kv_slots": 0, "slots_in_use": 0, "busy_s": 0.0}
    b = stats["b"]
    assert (b["status"], b["process"], b["requests"], b["running"], b["kv_slots"], b["slots_in_use"]) == \
        ("up", "rep", 3, 3, 3, 4)
    assert b["busy_s"] == 1.5
    assert b["replicas"]["rep#0"]["running"] == 2 and b["replicas"]["rep#1"]["status"] == "up"
    assert stats["c"]["stream_buffers"] == 1
    assert "replicas" not in stats["a"] and "node" not in stats["a"]  # one replica, one machine


def test_a_down_replica_makes_the_stage_degraded_and_all_down_makes_it_down() -> None:
    topology = loads(TOPOLOGY)
    replies = {"a": reply("a", a=m.StageStats()), "rep#1": reply("rep#1", b=m.StageStats(queued=2), c=m.StageStats())}
    stats = stage_stats(topology, replies, down={"rep#0"})
    assert stats["b"]["status"] == "degraded" and stats["b"]["queued"] == 2
    assert stats["b"]["replicas"]["rep#0"] == {"status": "down"}
    stats = stage_stats(topology, {"a": reply("a", a=m.StageStats())}, down={"rep#0", "rep#1"})
    assert (stats["b"]["status"], stats["c"]["status"], stats["a"]["status"]) == ("down", "down", "up")


def test_a_replica_that_did_not_answer_is_unknown() -> None:
    stats = stage_stats(loads(TOPOLOGY), {"rep#0": reply("rep#0", b=m.StageStats(), c=m.StageStats())}, down=set())
    assert stats["a"] == {"status": "unknown", "process": "a"}
    assert stats["b"]["status"] == "unknown"  # one replica answered, one did not
    assert stats["b"]["replicas"]["rep#1"] == {"status": "unknown"}


def test_a_standby_replica_is_shown_as_such_and_counts_for_no_status() -> None:
    topology = loads(TOPOLOGY.replace("rep: {replicas: 2}", "rep: {replicas: {min: 1, max: 2}}"))
    replies = {"a": reply("a", a=m.StageStats()),
               "rep#0": reply("rep#0", b=m.StageStats(requests=1, rank_kv_slots=[5, 6]), c=m.StageStats())}
    stats = stage_stats(topology, replies, down=set(), standby={"rep#1"})
    b = stats["b"]
    assert b["status"] == "up" and b["replicas"]["rep#1"] == {"status": "standby"}  # not "unknown"
    assert b["replicas"]["rep#0"]["rank_kv_slots"] == [5, 6] and b["rank_kv_slots"] == [5, 6]
    assert "rank_kv_slots" not in stats["c"]["replicas"]["rep#0"]  # only tensor-parallel stages have ranks


def test_busy_is_the_longest_step_of_the_replicas_even_when_the_last_is_idle() -> None:
    replies = {"rep#0": reply("rep#0", b=m.StageStats(busy_s=0.25), c=m.StageStats()),
               "rep#1": reply("rep#1", b=m.StageStats(busy_s=0.0), c=m.StageStats())}
    assert stage_stats(loads(TOPOLOGY), replies, down=set())["b"]["busy_s"] == 0.25


def test_multi_node_stages_say_where_they_run() -> None:
    topology = loads(LABELLED)
    stats = stage_stats(topology, {}, down=set())
    assert (stats["a"]["node"], stats["b"]["node"]) == ("-", "gpu-box")


def test_nodes_are_up_degraded_or_down_by_their_processes() -> None:
    topology = loads(LABELLED)
    assert node_stats(topology, down=set()) == {
        "-": {"processes": ["a"], "status": "up"},
        "gpu-box": {"processes": ["far#0", "far#1"], "status": "up"},
    }
    assert node_stats(topology, down={"far#1"})["gpu-box"]["status"] == "degraded"
    nodes = node_stats(topology, down={"far#0", "far#1", "a"})
    assert (nodes["gpu-box"]["status"], nodes["-"]["status"]) == ("down", "down")
