"""Aggregator: the live per-stage / per-edge figures the dashboard and bench read."""

from __future__ import annotations

import random
import time

import pytest

from omnictl.profiling.aggregate import Aggregator, percentile
from omnictl.profiling.events import Event, EventKind
from tests.support.synthetic import qwen_omni_topology, synthetic_request

S = 1_000_000_000
TOPOLOGY = qwen_omni_topology()


def _gap(events: list[Event], first: EventKind, then: EventKind, stage: str | None = None) -> float:
    a = next(e.ts for e in events if e.kind is first and (stage is None or e.stage == stage))
    b = next(e.ts for e in events if e.kind is then and (stage is None or e.stage == stage))
    return (b - a) / 1e9


@pytest.fixture
def now() -> int:
    return time.time_ns()


def _requests(now: int) -> tuple[list[list[Event]], list[list[Event]]]:
    old = [synthetic_request(f"old{i}", TOPOLOGY, start_ns=now - (25 - i) * S) for i in range(5)]
    recent = [synthetic_request(f"new{i}", TOPOLOGY, start_ns=now - (5 - i) * S, work_ms=1 + i) for i in range(4)]
    return old, recent


def test_header_counts_rates_and_first_output_latency(now: int) -> None:
    old, recent = _requests(now)
    aggregator = Aggregator(window_s=10)
    for events in old + recent:
        aggregator.add(events)
    aggregator.add([Event(EventKind.ADMITTED, "pending", None, "coordinator", now - S)])
    header = aggregator.snapshot(now).header
    assert (header.completed, header.failed, header.aborted, header.in_flight) == (9, 0, 0, 1)
    assert header.requests_per_s == pytest.approx(4 / 10)
    ttft = sorted(_gap(e, EventKind.ADMITTED, EventKind.FIRST_TEXT) for e in recent)
    ttfa = sorted(_gap(e, EventKind.ADMITTED, EventKind.FIRST_AUDIO) for e in recent)
    assert header.ttft_p50_s == pytest.approx(ttft[1]) and header.ttft_p99_s == pytest.approx(ttft[-1])
    assert header.ttfa_p50_s == pytest.approx(ttfa[1]) and header.ttfa_p99_s == pytest.approx(ttfa[-1])
    assert header.uptime_s == pytest.approx(25, abs=0.01)


def test_stage_and_edge_figures(now: int) -> None:
    old, recent = _requests(now)
    aggregator = Aggregator(window_s=10)
    for events in old + recent:
        aggregator.add(events)
    snapshot = aggregator.snapshot(now)
    assert list(snapshot.stages) == list(TOPOLOGY.stages)
    thinker = snapshot.stages["thinker"]
    times = sorted(
        (next(e.ts for e in ev if e.kind is EventKind.STAGE_DONE and e.stage == "thinker")
         - min(e.ts for e in ev if e.stage == "thinker" and e.process == "thinker")) / 1e9
        for ev in recent
    )
    assert thinker.process == "thinker" and thinker.done == 9 and thinker.in_flight == 0
    assert thinker.items_per_s == pytest.approx(4 / 10)
    assert thinker.p50_s == pytest.approx(times[1]) and thinker.p99_s == pytest.approx(times[-1])
    # share: the stage's part of all stages' time in the window
    all_stages = sum(
        (next(e.ts for e in ev if e.kind is EventKind.STAGE_DONE and e.stage == name)
         - min(e.ts for e in ev if e.stage == name and e.process == TOPOLOGY.process_of(name))) / 1e9
        for ev in recent for name in TOPOLOGY.stages
    )
    assert thinker.share == pytest.approx(sum(times) / all_stages)
    assert sum(s.share or 0 for s in snapshot.stages.values()) == pytest.approx(1.0)
    assert thinker.n == 4 and not thinker.stale
    assert thinker.batch_size == 1
    stream = snapshot.edges[("thinker", "talker", "stream")]
    assert (stream.transport, stream.hops) == ("relay", 12)
    assert stream.p50_s == pytest.approx(0.0008)
    assert stream.mb_per_s == pytest.approx(12 * 1024 / 1e6 / 10)
    assert snapshot.edges[("thinker", "decode", "data")].transport == "inproc"


def test_in_flight_at_a_stage(now: int) -> None:
    events = synthetic_request("r", TOPOLOGY, start_ns=now - S)
    cut = next(i for i, e in enumerate(events) if e.kind is EventKind.PREFILL_START)
    aggregator = Aggregator()
    aggregator.add(events[:cut])
    snapshot = aggregator.snapshot(now)
    assert snapshot.header.in_flight == 1
    assert snapshot.stages["thinker"].in_flight == 1
    assert snapshot.stages["preprocessing"].in_flight == 0
    aggregator.add(events[cut:])
    after = aggregator.snapshot(now)
    assert (after.header.in_flight, after.stages["thinker"].in_flight) == (0, 0)


def test_batches_out_of_order_give_the_same_snapshot(now: int) -> None:
    old, recent = _requests(now)
    everything = [e for events in old + recent for e in events]
    in_order = Aggregator(window_s=10)
    in_order.add(everything)
    shuffled = Aggregator(window_s=10)
    rng = random.Random(7)
    # What the collector sees: each process's batches in order (one FIFO socket each),
    # processes interleaved at random, so a completion can come before the hops behind it.
    per_process: dict[str, list[list[Event]]] = {}
    for event in sorted(everything, key=lambda e: e.ts):
        batches = per_process.setdefault(event.process, [[]])
        if len(batches[-1]) == 7:
            batches.append([])
        batches[-1].append(event)
    while per_process:
        process = rng.choice(sorted(per_process))
        shuffled.add(per_process[process].pop(0))
        if not per_process[process]:
            del per_process[process]
    a, b = in_order.snapshot(now), shuffled.snapshot(now)
    assert a.header == b.header
    assert a.edges == b.edges
    assert {k: v for k, v in a.stages.items()} == {k: b.stages[k] for k in a.stages}


def test_failures_aborts_and_drops_are_counted(now: int) -> None:
    aggregator = Aggregator()
    aggregator.add(
        [
            Event(EventKind.ADMITTED, "f", None, "coordinator", now - 3 * S),
            Event(EventKind.FAILED, "f", "thinker", "coordinator", now - 2 * S, {"error": "boom"}),
            Event(EventKind.ADMITTED, "a", None, "coordinator", now - 3 * S),
            Event(EventKind.ABORTED, "a", None, "coordinator", now - 2 * S),
            Event(EventKind.ABORTED, "a", None, "coordinator", now - S),  # counted once
            Event(EventKind.DROPPED, "", None, "talker", now, {"count": 42}),
        ]
    )
    header = aggregator.snapshot(now).header
    assert (header.failed, header.aborted, header.completed, header.in_flight) == (1, 1, 0, 0)
    assert header.dropped_events == 42


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
