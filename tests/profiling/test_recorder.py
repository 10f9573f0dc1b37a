"""Recorder: ships batches over its own PUSH socket, never blocks, counts what it drops."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from omnictl.profiling.collector import Collector
from omnictl.profiling.events import EventKind
from omnictl.profiling.recorder import Recorder


def _record_in_child(address: str, count: int) -> None:
    recorder = Recorder("child-process", address, flush_interval=0.01)
    for index in range(count):
        recorder.record(EventKind.QUEUE_ENTER, f"req-{index % 5}", "thinker", batch_size=index)
    recorder.close(timeout=2.0)


def test_events_recorded_in_a_child_process_reach_the_collector(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/profile.sock"
    before = time.time_ns()
    with Collector(tmp_path / "run", address) as collector:
        child = multiprocessing.get_context("spawn").Process(target=_record_in_child, args=(address, 500))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert collector.wait_for(500, timeout=10), f"only {collector.received} of 500 events arrived"
    after = time.time_ns()
    events = collector.store.events("req-3")
    assert len(events) == 100
    assert {e.process for e in events} == {"child-process"}
    assert {e.stage for e in events} == {"thinker"}
    assert all(before <= e.ts <= after for e in events), "timestamps are comparable across processes"
    assert sorted(int(e.meta["batch_size"] or 0) for e in events) == list(range(3, 500, 5))


def test_full_buffer_drops_and_counts_and_tells_the_collector(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/profile.sock"
    with Collector(tmp_path / "run", address) as collector:
        # A flush interval of an hour: nothing ships until we flush, so the buffer fills.
        recorder = Recorder("p", address, capacity=10, flush_interval=3600)
        for index in range(25):
            recorder.record(EventKind.BUILD_START, f"r{index}", "s")
        assert recorder.dropped == 15
        recorder.flush()
        assert collector.wait_for(11, timeout=10)  # 10 events + the drop report
        recorder.close()
    assert collector.aggregator.snapshot().header.dropped_events == 15
    assert [rid for rid, _ in collector.store.request_ids()] == [f"r{i}" for i in range(10)]


def test_dead_collector_never_blocks_record_or_flush(tmp_path: Path) -> None:
    recorder = Recorder("p", f"ipc://{tmp_path}/nobody-listens.sock", capacity=100, flush_interval=3600)
    finished = threading.Event()

    def hammer() -> None:
        for batch in range(300):
            for index in range(10):
                recorder.record(EventKind.HOP_SENT, f"r{batch}", "s", target="t", bytes=index)
            recorder.flush()
        recorder.close(timeout=0.1)
        finished.set()

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    assert finished.wait(30), "record/flush/close blocked with no collector"
    assert recorder.dropped > 0, "once ZeroMQ's high-water mark is full, batches are dropped"
    assert recorder.shipped + recorder.dropped >= 3000


def test_unencodable_meta_drops_only_that_event(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/profile.sock"
    with Collector(tmp_path / "run", address) as collector:
        recorder = Recorder("p", address, flush_interval=3600)
        recorder.record(EventKind.BUILD_START, "good-1", "s")
        recorder.record(EventKind.BUILD_START, "bad", "s", tensor=object())  # type: ignore[arg-type]
        recorder.record(EventKind.BUILD_END, "good-2", "s")
        recorder.flush()
        recorder.flush()  # drops found while encoding are reported with the next batch
        assert collector.wait_for(3, timeout=10)  # two good events and the drop report
        recorder.close()
    assert recorder.dropped == 1
    assert collector.aggregator.snapshot().header.dropped_events == 1
    assert sorted(rid for rid, _ in collector.store.request_ids()) == ["good-1", "good-2"]
