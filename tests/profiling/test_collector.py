"""Collector: receives batches on a PULL socket, stores them and feeds the aggregator."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from omnictl.profiling.collector import Collector
from omnictl.profiling.store import TraceStore
from omnictl.profiling.synthetic import synthetic_request


def test_local_recorder_events_are_stored_and_aggregated(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/c.sock"
    with Collector(tmp_path / "run", address) as collector:
        recorder = collector.local_recorder()
        for event in synthetic_request("req-1"):
            recorder.record(event.kind, event.request_id, event.stage, **event.meta)
        recorder.close()
        assert collector.wait_for(len(synthetic_request("req-1")), timeout=10)
    assert collector.aggregator.snapshot().header.completed == 1
    # Readable by a fresh store, as `omnictl trace` does after the server stopped.
    stored = TraceStore(tmp_path / "run").events("req-1")
    assert stored[0].kind.value == "admitted"
    assert {e.process for e in stored} == {"coordinator"}


def test_malformed_messages_are_counted_and_skipped(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/c.sock"
    with Collector(tmp_path / "run", address) as collector:
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.connect(address)
        push.send(b"not msgpack at all \xff")
        recorder = collector.local_recorder("other")
        recorder.record(synthetic_request("r")[0].kind, "r")
        recorder.close()
        assert collector.wait_for(1, timeout=10)
        push.close(linger=0)
        context.term()
    assert collector.malformed == 1
    assert collector.store.request_ids() == [("r", None)]


def test_bind_failure_names_the_address(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/no-such-dir/c.sock"
    with pytest.raises(OSError, match="no-such-dir"):
        Collector(tmp_path / "run", address).start()
