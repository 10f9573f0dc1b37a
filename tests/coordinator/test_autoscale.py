"""The autoscaler's decisions alone: fed the clock and the requests in flight per replica."""

from __future__ import annotations

from omnictl.coordinator.autoscale import Autoscaler
from omnictl.topology import loads

TOPOLOGY = """
stages:
  - {name: prep, factory: m.prep, next: [work]}
  - {name: work, factory: m.work, terminal: true}
processes:
  work: {replicas: {min: 1, max: 3, queue: 2, window: 1, idle: 5}}
"""
W = ("work#0", "work#1", "work#2")


def test_a_queue_past_the_threshold_for_the_window_adds_one_replica_at_a_time() -> None:
    scaler = Autoscaler(loads(TOPOLOGY))
    running = {"work": ["work#0"]}
    standby = {"work#1", "work#2"}
    busy = {"work#0": 3}
    assert scaler.decide(0.0, busy, running, standby, set()) == []
    assert scaler.decide(0.5, {"work#0": 1}, running, standby, set()) == []  # fell back: the window restarts
    assert scaler.decide(0.6, busy, running, standby, set()) == []
    assert scaler.decide(1.5, busy, running, standby, set()) == []
    (up,) = scaler.decide(1.6, busy, running, standby, set())  # 3 in flight, threshold 2: one more does
    assert (up.process, up.instance, up.up, up.figure) == ("work", "work#1", True, 3.0)
    assert up.why == "3.0 requests in flight per replica for 1.0s (above 2 for 1s)"
    assert scaler.decide(5.0, busy, running, standby, {"work#1"}) == []  # not while one is starting
    running = {"work": ["work#0", "work#1", "work#2"]}
    assert scaler.decide(9.0, dict.fromkeys(W, 9), running, set(), set()) == []  # at max
    assert scaler.counts == {("work", "up"): 1, ("work", "down"): 0}


def test_a_burst_starts_as_many_replicas_as_bring_the_queue_back_to_the_threshold_at_once() -> None:
    scaler = Autoscaler(loads(TOPOLOGY))
    running = {"work": ["work#0"]}
    assert scaler.decide(0.0, {"work#0": 30}, running, {"work#1", "work#2"}, set()) == []
    ups = scaler.decide(1.0, {"work#0": 30}, running, {"work#1", "work#2"}, set())
    assert [(d.instance, d.up) for d in ups] == [("work#1", True), ("work#2", True)]  # 15 wanted, 2 left


def test_a_calm_process_beyond_min_drains_the_replica_holding_least_after_the_idle_window() -> None:
    scaler = Autoscaler(loads(TOPOLOGY))
    running = {"work": list(W)}
    calm = {"work#0": 1, "work#1": 0, "work#2": 1}  # 0.7 per replica: at most half of 2
    assert scaler.decide(0.0, calm, running, set(), set()) == []
    assert scaler.decide(4.0, {**calm, "work#1": 2}, running, set(), set()) == []  # 1.3: the window restarts
    assert scaler.decide(4.5, calm, running, set(), set()) == []
    (down,) = scaler.decide(9.5, calm, running, set(), set())
    assert (down.instance, down.up) == ("work#1", False)
    assert down.why == ("0.7 requests in flight per replica for 5.0s "
                        "(at most 1, half the threshold, for the idle window 5s)")
    running = {"work": ["work#0", "work#2"]}
    assert scaler.decide(10.0, calm, running, {"work#1"}, set()) == []
    (down,) = scaler.decide(15.0, calm, running, {"work#1"}, set())
    assert down.instance == "work#2"  # a tie: the highest-numbered goes; its request completes first
    # nothing in flight: back to min in one idle window
    assert scaler.decide(20.0, {}, {"work": list(W)}, set(), set()) == []
    assert [d.instance for d in scaler.decide(25.0, {}, {"work": list(W)}, set(), set())] == ["work#2", "work#1"]
    # at min, a calm replica stays
    assert scaler.decide(99.0, {"work#0": 0}, {"work": ["work#0"]}, {"work#1", "work#2"}, set()) == []
    assert scaler.decide(199.0, {"work#0": 0}, {"work": ["work#0"]}, {"work#1", "work#2"}, set()) == []
    assert scaler.counts == {("work", "up"): 0, ("work", "down"): 4}


def test_a_fixed_count_is_never_scaled() -> None:
    scaler = Autoscaler(loads(TOPOLOGY.replace("{min: 1, max: 3, queue: 2, window: 1, idle: 5}", "3")))
    assert scaler.processes == []
    assert scaler.decide(100.0, dict.fromkeys(W, 50), {}, set(), set()) == []


TOPOLOGY4 = TOPOLOGY.replace("max: 3", "max: 4")


def test_a_step_in_load_starts_what_its_arrival_rate_needs_at_once_though_the_queue_is_still_short() -> None:
    scaler = Autoscaler(loads(TOPOLOGY4))
    running = {"work": ["work#0"]}
    standby = {"work#1", "work#2", "work#3"}
    # 60 requests/s arrive at one replica that serves 20/s; the window is too short for a long queue
    assert scaler.decide(0.0, {"work#0": 3}, running, standby, set(), {"work#0": (100, 99)}) == []
    ups = scaler.decide(1.0, {"work#0": 3}, running, standby, set(), {"work#0": (160, 119)})
    # 4 needed at most 80 % busy (3 at 100 %, where the queue still grows at the first wobble);
    # the queue alone asked for 1
    assert [d.instance for d in ups] == ["work#1", "work#2", "work#3"]
    assert ups[0].why == ("3.0 requests in flight per replica for 1.0s (above 2 for 1s); "
                          "60.0 arriving/s, 20.0/s served per replica: 4 needed at most 80% busy")


def test_a_busy_process_with_short_queues_keeps_its_replicas_and_sheds_them_as_its_arrivals_fall() -> None:
    # Three replicas 80 % busy hold one request or less each: calm by the queue alone, which
    # used to drain one, overload the other two and scale up again (flapping).
    scaler = Autoscaler(loads(TOPOLOGY4))
    standby = {"work#1", "work#2", "work#3"}
    scaler.decide(0.0, {"work#0": 3}, {"work": ["work#0"]}, standby, set(), {"work#0": (100, 99)})
    assert len(scaler.decide(1.0, {"work#0": 3}, {"work": ["work#0"]}, standby, set(), {"work#0": (160, 119)})) == 3
    live = ["work#0", "work#1", "work#2", "work#3"]
    arrived, t, downs = 160, 1.0, []
    while t < 20.0:
        t += 0.25
        busy = t < 10.0  # 48/s until 10 s (12 a tick), then none
        arrived += 12 if busy else 0
        flight = dict.fromkeys(live, 1) if busy else {}
        for d in scaler.decide(t, flight, {"work": list(live)}, standby - set(live), set(), {"work#0": (arrived, 0)}):
            downs.append((t, d.instance))
            live.remove(d.instance)
    # 48/s needs 3 replicas at 16/s (80 % of 20): the fourth the step started goes once calm for
    # the idle window (5 s), and no other while the phase lasts; the window then slides past
    # the busy phase and leaves 2 (at most 32/s) at 11.5 s, then 1 (16/s) at 13.25 s
    assert downs == [(6.25, "work#3"), (11.5, "work#2"), (13.25, "work#1")]
    assert scaler.counts == {("work", "up"): 3, ("work", "down"): 3}


def test_the_arrival_rate_is_over_the_whole_window_kept_and_unknown_without_a_span() -> None:
    scaler = Autoscaler(loads(TOPOLOGY))
    samples = scaler._arrivals["work"]
    assert scaler._arrival_rate("work") is None  # nothing seen yet
    samples.append((5.0, 0))
    assert scaler._arrival_rate("work") is None  # one sample: no span
    samples.append((5.0, 4))
    assert scaler._arrival_rate("work") is None  # two at one instant: no span either
    samples.clear()
    samples.extend([(5.0, 0), (6.0, 3)])  # 3 requests in 1 s (the counts are not times)
    assert scaler._arrival_rate("work") == 3.0
    samples.append((7.0, 10))  # first to last: 10 in 2 s, not the last two samples' 7 in 1 s
    assert scaler._arrival_rate("work") == 5.0
    samples.clear()
    samples.extend([(5.0, 0), (5.0, 2), (6.0, 4)])  # two at the window's start: the span is still 1 s
    assert scaler._arrival_rate("work") == 4.0
