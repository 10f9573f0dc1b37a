"""Collector: receives batches on a PULL socket, stores them and feeds the aggregator,
in a process of its own (the default) or in a thread of the caller's process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from omnictl.profiling.collector import Collector
from omnictl.profiling.events import EventKind
from omnictl.profiling.store import TraceStore
from tests.support.synthetic import synthetic_request
from tests.support.wait import until


@pytest.fixture(params=[True, False], ids=["own-process", "thread"])
def separate_process(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_local_recorder_events_are_stored_and_aggregated(tmp_path: Path, separate_process: bool) -> None:
    address = f"ipc://{tmp_path}/c.sock"
    events = synthetic_request("req-1")
    with Collector(tmp_path / "run", address, separate_process=separate_process) as collector:
        assert (collector.pid != os.getpid()) is separate_process
        recorder = collector.local_recorder()
        for event in events:
            recorder.record(event.kind, event.request_id, event.stage, **event.meta)
        recorder.close()
        assert collector.wait_for(len(events), timeout=10)
        assert collector.aggregator.snapshot().header.completed == 1
        # `omnictl trace` works while the server runs: what was received is on disk.
        assert len(TraceStore(tmp_path / "run").events("req-1")) == len(events)
    assert collector.received == len(events)
    assert collector.aggregator.snapshot().header.completed == 1, "figures stay readable after close"
    # Readable by a fresh store, as `omnictl trace` does after the server stopped.
    stored = TraceStore(tmp_path / "run").events("req-1")
    assert stored[0].kind is EventKind.ADMITTED
    assert {e.process for e in stored} == {"coordinator"}


def test_malformed_messages_are_counted_and_skipped(tmp_path: Path, separate_process: bool) -> None:
    address = f"ipc://{tmp_path}/c.sock"
    with Collector(tmp_path / "run", address, separate_process=separate_process) as collector:
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.connect(address)
        push.send(b"not msgpack at all \xff")
        recorder = collector.local_recorder("other")
        recorder.record(EventKind.ADMITTED, "r")
        recorder.close()
        assert collector.wait_for(1, timeout=10)
        until(lambda: collector.malformed == 1, timeout=10)
        push.close(linger=0)
        context.term()
    assert collector.malformed == 1
    assert collector.store.request_ids() == [("r", None)]


def test_bind_failure_names_the_address(tmp_path: Path, separate_process: bool) -> None:
    address = f"ipc://{tmp_path}/no-such-dir/c.sock"
    with pytest.raises(OSError, match="no-such-dir"):
        Collector(tmp_path / "run", address, separate_process=separate_process).start()


def test_a_dead_collector_process_does_not_hang_its_users(tmp_path: Path) -> None:
    collector = Collector(tmp_path / "run", f"ipc://{tmp_path}/c.sock").start()
    recorder = collector.local_recorder()
    recorder.record(EventKind.ADMITTED, "r")
    recorder.flush()
    assert collector.wait_for(1, timeout=10)
    before = collector.aggregator.snapshot()
    os.kill(collector.pid, signal.SIGKILL)
    assert before.header.in_flight == 1
    assert collector.aggregator.snapshot() == before, "the last figures, not a hang or a crash"
    with pytest.raises(RuntimeError, match="not answering"):
        collector.received
    recorder.record(EventKind.COMPLETED, "r")  # recording carries on, into the void
    recorder.close(timeout=0.1)
    collector.close()


def test_ctrl_c_leaves_stopping_to_the_coordinator(tmp_path: Path) -> None:
    with Collector(tmp_path / "run", f"ipc://{tmp_path}/c.sock") as collector:
        os.kill(collector.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the process group
        recorder = collector.local_recorder()
        recorder.record(EventKind.ADMITTED, "r")
        recorder.close()
        assert collector.wait_for(1, timeout=10), "the collector kept working"


def test_the_collector_process_exits_with_its_parent(tmp_path: Path) -> None:
    script = (
        "import sys, threading; from pathlib import Path; from omnictl.profiling.collector import Collector\n"
        f"c = Collector(Path({str(tmp_path / 'run')!r}), 'ipc://{tmp_path}/c.sock').start()\n"
        "print(c.pid, flush=True); threading.Event().wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    collector_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()

    def gone() -> bool:
        try:
            os.kill(collector_pid, 0)
        except ProcessLookupError:
            return True
        # A zombie (dead, unreaped by its dead parent) counts as gone.
        return Path(f"/proc/{collector_pid}/stat").read_text().split(")")[1].split()[0] == "Z"

    until(gone, "the orphaned collector process to exit", timeout=10)


def test_control_address_is_needed_beyond_ipc(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="control_address"):
        Collector(tmp_path, "tcp://127.0.0.1:5555")
    assert Collector(tmp_path, "tcp://127.0.0.1:5555", separate_process=False).control_address is None


def test_snapshots_asked_while_the_collector_process_stops_get_the_last_one_never_an_error(tmp_path: Path) -> None:
    """The dashboard's status thread asks for snapshots whenever it likes; stop() closing the
    control socket under one of its polls failed it with "Socket operation on non-socket"."""
    errors: list[BaseException] = []
    asked = threading.Event()
    done = threading.Event()

    def keep_asking(collector: Collector) -> None:
        while not done.is_set():
            try:
                collector.aggregator.snapshot()
            except BaseException as error:  # noqa: BLE001  # any error is the failure this test records
                errors.append(error)
                return
            asked.set()

    for _ in range(5):  # the race is narrow: stop several times while snapshots are being asked for
        collector = Collector(tmp_path / "run", f"ipc://{tmp_path}/c.sock").start()
        asker = threading.Thread(target=keep_asking, args=(collector,))
        asked.clear()
        done.clear()
        asker.start()
        try:
            until(asked.is_set, "a first snapshot", timeout=10)
        finally:
            collector.close()
            done.set()
            asker.join(10)
        assert not errors, errors
