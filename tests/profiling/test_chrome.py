"""Chrome / Perfetto trace-event export."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from omnictl.profiling.chrome import to_chrome
from omnictl.profiling.spans import build_trace
from tests.support.synthetic import qwen_omni_topology, synthetic_request

MS = 1_000_000
TOPOLOGY = qwen_omni_topology()


def _export() -> dict[str, Any]:
    trace = build_trace("r", synthetic_request("r", TOPOLOGY, start_ns=1000 * MS))
    document: dict[str, Any] = json.loads(json.dumps(to_chrome(trace)))  # must survive a JSON round trip
    return document


def test_structure() -> None:
    document = _export()
    events = document["traceEvents"]
    assert document["displayTimeUnit"] == "ms" and document["otherData"]["request_id"] == "r"
    assert set(Counter(e["ph"] for e in events)) == {"X", "s", "f", "i", "M"}
    for event in events:
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int) and isinstance(event["name"], str)
        if event["ph"] == "X":
            assert event["ts"] >= 0 and event["dur"] >= 0


def test_one_pid_per_process_one_tid_per_stage() -> None:
    events = _export()["traceEvents"]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(process_names.values()) == sorted({"coordinator", *(p for p in TOPOLOGY.processes)})
    stage_tracks = {name: key for key, name in thread_names.items() if name in TOPOLOGY.stages}
    assert set(stage_tracks) == set(TOPOLOGY.stages)
    for stage, (pid, _tid) in stage_tracks.items():
        assert process_names[pid] == TOPOLOGY.process_of(stage)
    stage_spans = [e for e in events if e["ph"] == "X" and e["cat"] == "stage"]
    assert {thread_names[(e["pid"], e["tid"])] for e in stage_spans} == set(TOPOLOGY.stages)


def test_flows_join_sender_and_receiver_stages() -> None:
    events = _export()["traceEvents"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == finishes.keys()
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert finish["bp"] == "e" and finish["ts"] >= start["ts"]
        src, dst = start["name"].split(" → ")
        assert thread_names[(start["pid"], start["tid"])] in (src, "request")
        assert thread_names[(finish["pid"], finish["tid"])] == dst
    hop = next(e for e in events if e["ph"] == "s" and e["name"] == "thinker → talker" and e["cat"] == "hop")
    x = next(e for e in events if e["ph"] == "X" and e["cat"] == "hop" and e["name"] == "thinker → talker")
    assert x["ts"] == hop["ts"] and x["dur"] == 800.0 and x["args"]["transport"] == "relay"
