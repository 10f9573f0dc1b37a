"""TraceStore (JSONL segments with rotation) and run directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import msgspec
import pytest

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.store import (
    TraceError,
    TraceStore,
    default_run_dir,
    read_run_info,
    resolve_run_dir,
    write_run_info,
)
from tests.support.synthetic import qwen_omni_topology, synthetic_request

MS = 1_000_000


def test_events_come_back_in_time_order_from_a_fresh_store(tmp_path: Path) -> None:
    writer = TraceStore(tmp_path)
    events = synthetic_request("req-a", start_ns=1_000 * MS)
    writer.append(list(reversed(events)))
    writer.append(synthetic_request("req-b", start_ns=2_000 * MS))
    writer.close()
    reader = TraceStore(tmp_path)
    got = reader.events("req-a")
    assert [e.ts for e in got] == sorted(e.ts for e in events)
    assert sorted(got, key=repr) == sorted(events, key=repr)
    assert reader.events("req-") == []  # whole ids only
    assert reader.events("missing") == []


def test_last_and_slowest(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    for index, work_ms in enumerate([1.0, 5.0, 3.0]):
        store.append(synthetic_request(f"r{index}", start_ns=(index + 1) * 1000 * MS, work_ms=work_ms))
    in_flight = [Event(EventKind.ADMITTED, "r3", None, "coordinator", 9000 * MS)]
    store.append(in_flight)
    assert [rid for rid, _ in store.request_ids(last=2)] == ["r3", "r2"]
    slowest = store.request_ids(slowest=2)
    assert [rid for rid, _ in slowest] == ["r1", "r2"]
    assert slowest[0][1] is not None and slowest[0][1] > slowest[1][1]  # type: ignore[operator]
    assert dict(store.request_ids())["r3"] is None
    with pytest.raises(ValueError, match="not both"):
        store.request_ids(last=1, slowest=1)


def test_rotation_bounds_the_size(tmp_path: Path) -> None:
    store = TraceStore(tmp_path, segment_bytes=20_000, max_segments=3)
    for index in range(200):
        store.append(synthetic_request(f"r{index}", start_ns=(index + 1) * 100 * MS))
    store.close()
    batch_bytes = len(msgspec.json.encode(synthetic_request("r199"))) + 1
    assert len(store.segments()) == 3
    assert store.size_bytes() <= 3 * (20_000 + batch_bytes)
    kept = {rid for rid, _ in store.request_ids()}
    assert "r199" in kept and "r0" not in kept, "the oldest events rotate out first"


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.append(synthetic_request("r1"))
    store.close()
    with open(store.segments()[-1], "ab") as segment:
        segment.write(b'[["completed","r1",nu')  # a writer died mid-line
    assert TraceStore(tmp_path).events("r1")[-1].kind is EventKind.COMPLETED


def test_default_run_dir_and_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(TraceError, match="--run-dir"):
        resolve_run_dir(None)
    run_dir = default_run_dir()
    assert run_dir.parent == tmp_path / "state" / "omnictl" / "runs"
    assert run_dir.name.endswith(f"-{os.getpid()}")
    assert resolve_run_dir(None) == run_dir.resolve()
    with pytest.raises(TraceError, match="does not exist"):
        resolve_run_dir(tmp_path / "nope")


def test_run_info_round_trips(tmp_path: Path) -> None:
    assert read_run_info(tmp_path) is None
    written = write_run_info(tmp_path, qwen_omni_topology())
    info = read_run_info(tmp_path)
    assert info == written
    assert info is not None and info.topology == "qwen-omni"
    assert {s.name: s.process for s in info.stages}["code2wav"] == "talker"
    assert any((e.src, e.dst, e.kind, e.transport) == ("thinker", "talker", "stream", "relay") for e in info.edges)
    (tmp_path / "run.json").write_text("{broken")
    with pytest.raises(TraceError, match="run.json"):
        read_run_info(tmp_path)


def test_only_the_newest_default_runs_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "state" / "omnictl" / "runs"
    root.mkdir(parents=True)
    exited = subprocess.Popen(["true"])
    exited.wait()  # runs of a process that exited may go
    for day in range(1, 6):
        (root / f"2020010{day}-120000-{exited.pid}").mkdir()
    (root / "my-notes").mkdir()  # not a default run: never touched
    newest = default_run_dir(keep=3)
    assert sorted(p.name for p in root.iterdir() if p.name != "latest") == sorted(
        [f"20200104-120000-{exited.pid}", f"20200105-120000-{exited.pid}", newest.name, "my-notes"]
    )


def test_one_request_s_flood_of_events_keeps_to_its_share_and_the_trace_says_what_was_dropped(tmp_path: Path) -> None:
    # Before: a request of tiny stream chunks (a few events each) filled the whole rotation
    # and every other request's trace rotated out.
    from omnictl.profiling.spans import build_trace
    from omnictl.profiling.trace_render import render_waterfall

    store = TraceStore(tmp_path, segment_bytes=50_000, max_segments=4, request_bytes=20_000)
    quiet = synthetic_request("quiet", start_ns=1_000 * MS)
    store.append(quiet)
    flood = [Event(EventKind.ADMITTED, "flood", None, "coordinator", 2_000 * MS)]
    flood += [Event(EventKind.STREAM_RECEIVED, "flood", "asr", "asr", 2_000 * MS + i, {"source": "in", "seq": i})
              for i in range(20_000)]  # ~1.3 MB of events into a store of 200 kB
    for start in range(0, len(flood), 100):
        store.append(flood[start : start + 100], flush=False)
    store.append([Event(EventKind.COMPLETED, "flood", None, "coordinator", 3_000 * MS)])
    store.close()
    reader = TraceStore(tmp_path)
    assert sorted(reader.events("quiet"), key=repr) == sorted(quiet, key=repr)  # not rotated out
    stored = reader.events("flood")
    notes = [e for e in stored if e.kind is EventKind.DROPPED]
    kept = [e for e in stored if e.kind is not EventKind.DROPPED]
    assert sum(len(msgspec.json.encode(e)) for e in kept) <= 20_000
    assert [e.kind for e in kept[:1] + kept[-1:]] == [EventKind.ADMITTED, EventKind.COMPLETED]  # always kept
    assert len(notes) == 2 and notes[0].meta == {"count": 1, "share_bytes": 20_000}  # said at the first drop
    dropped = sum(int(note.meta["count"]) for note in notes)  # type: ignore[call-overload]
    assert dropped == len(flood) + 1 - len(kept) and dropped > 19_000
    assert {s.request_id: s.status for s in reader.summaries()} == {"quiet": "completed", "flood": "completed"}
    rendered = render_waterfall(build_trace("flood", stored), width=200).plain
    assert f"trace cut: {dropped} events of this request were not stored (its share of the trace store, 19.5 KB" in rendered


def test_a_request_s_share_is_a_32nd_of_the_store_and_bookkeeping_has_none(tmp_path: Path) -> None:
    assert TraceStore(tmp_path).request_bytes == 4 * 2**20  # of the default 128 MiB
    store = TraceStore(tmp_path, segment_bytes=1000, max_segments=2, request_bytes=100)
    drops = [Event(EventKind.DROPPED, "", None, "p", i, {"count": 5}) for i in range(20)]  # a recorder's, ~50 B each
    store.append(drops)
    store.close()
    assert [e for e in store.iter_events() if e.kind is EventKind.DROPPED] == drops
