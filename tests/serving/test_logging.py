"""Log records of one request carry its id, in text and JSON (a real server's output)."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import httpx
import pytest

from omnictl.logs import configure, request_scope
from tests.serving.harness import FAST_TOPOLOGY, start_server, stop_server


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_records_inside_a_request_scope_carry_its_id(fmt: str) -> None:
    out = io.StringIO()
    handler = configure("info", fmt, stream=out)  # type: ignore[arg-type]
    try:
        log = logging.getLogger("omnictl.test")
        with request_scope("chatcmpl-abc"):
            log.warning("inside")
        log.warning("outside")
    finally:
        logging.getLogger("omnictl").removeHandler(handler)
    inside, outside = out.getvalue().splitlines()
    if fmt == "json":
        assert json.loads(inside)["request_id"] == "chatcmpl-abc" and json.loads(inside)["message"] == "inside"
        assert json.loads(outside)["request_id"] == "-"
    else:
        assert "request=chatcmpl-abc" in inside and "request=-" in outside


def _records(text: str, fmt: str) -> list[dict[str, str]]:
    """The log records in a server's output (other lines, such as its banner, left out):
    JSON lines parsed; a text record is its first line plus the traceback lines after it."""
    records: list[dict[str, str]] = []
    in_traceback = False
    for line in text.splitlines():
        if fmt == "json":
            if line.startswith("{"):
                records.append(json.loads(line))
            continue
        head = _TEXT_RECORD.match(line)
        if head:
            records.append({"level": head["level"], "process": head["process"], "request_id": head["request"],
                            "message": head["message"], "traceback": ""})
        elif records and (in_traceback or line.startswith("Traceback (most recent call last)")):
            records[-1]["traceback"] += line + "\n"
            in_traceback = line.startswith(("Traceback", " "))  # its last line is the unindented exception
    return records


_TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (?P<level>[A-Z]+) \S+ \[(?P<process>[^\]]+)\] "
                          r"request=(?P<request>\S+): (?P<message>.*)$")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_failing_stage_logs_one_traceback_in_its_replica_and_the_server_logs_the_request_once(
        fmt: str, tmp_path: Path) -> None:
    """The stage raises (a whole answer, and a streamed one): for each request exactly one
    record with a traceback across the server's output (the stage process's, tagged with
    the replica and the request id), one server record saying the request failed and why,
    and both again under the run's logs/."""
    topology = tmp_path / "replicated.yaml"
    topology.write_text(FAST_TOPOLOGY.read_text() + "processes:\n  prep: {replicas: 2}\n")
    run_dir = tmp_path / "run"
    server = start_server(str(topology), "--log-format", fmt, "--run-dir", str(run_dir))
    ids = {False: f"boom-{fmt}", True: f"boom-streamed-{fmt}"}
    try:
        for stream, rid in ids.items():
            body = {"model": "fast", "stream": stream, "messages": [{"role": "user", "content": "explode"}]}
            response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid},
                                  timeout=30)
            assert response.status_code == (200 if stream else 500)
            assert not stream or '"code": "stage_failed"' in response.text or '"code":"stage_failed"' in response.text
    finally:
        assert stop_server(server) == 0
    assert server.text().count("Traceback (most recent call last)") == len(ids), server.text()
    for rid in ids.values():
        mine = [r for r in _records(server.text(), fmt) if r["request_id"] == rid]
        tracebacks = [r for r in mine if r.get("traceback")]
        assert len(tracebacks) == 1, server.text()
        stage_record = tracebacks[0]
        assert stage_record["process"] in ("prep#0", "prep#1") and stage_record["level"] == "ERROR"
        assert "stage 'prep' failed" in stage_record["message"]
        assert "fast_stages.py" in stage_record["traceback"] and "prep exploded on purpose" in stage_record["traceback"]
        served = [r for r in mine if r["process"] == "server"]
        assert len(served) == 1 and served[0]["level"] == "WARNING" and not served[0].get("traceback"), server.text()
        assert "prep exploded on purpose" in served[0]["message"]
        # The run directory has both, in the same format: the stage process's file and the server's.
        replica_log = (run_dir / "logs" / f"{stage_record['process']}.log").read_text()
        assert rid in [r["request_id"] for r in _records(replica_log, fmt) if r.get("traceback")]
        server_log = (run_dir / "logs" / "server.log").read_text()
        assert [r["message"] for r in _records(server_log, fmt) if r["request_id"] == rid] == [served[0]["message"]]
