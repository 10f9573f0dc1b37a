"""`omnictl trace`: waterfall, JSON, Chrome export, listing ids, and clear errors."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
import typer
from typer.testing import CliRunner

from omnictl.cli.trace import register
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.rundir import runs_root
from omnictl.profiling.store import TraceStore, default_run_dir, default_runs, write_run_info
from tests.support.synthetic import qwen_omni_topology, synthetic_request

MS = 1_000_000


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # keeps `trace` a subcommand, as in `omnictl`
        """omnictl"""

    register(app)
    return app


def _closed_url() -> str:
    """A loopback address nothing listens on (a port bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


NO_SERVER = _closed_url()


def _run(*args: str) -> typer.testing.Result:
    # OMNICTL_URL: no server answers, unless a test names one with --url (a server on
    # this machine's default port must not change what these tests see)
    return CliRunner().invoke(_app(), ["trace", *args], env={"COLUMNS": "80", "OMNICTL_URL": NO_SERVER, "OMNICTL_API_KEY": None})


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "run"
    write_run_info(directory, qwen_omni_topology())
    store = TraceStore(directory)
    for index, work_ms in enumerate([1.0, 4.0, 2.0]):
        store.append(synthetic_request(f"req-{index}", start_ns=(index + 1) * 1000 * MS, work_ms=work_ms))
    store.append([Event(EventKind.ADMITTED, "req-live", None, "coordinator", 5000 * MS)])
    store.close()
    return directory


def test_text_waterfall(run_dir: Path) -> None:
    result = _run("req-1", "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"run {run_dir}"
    assert lines[1].startswith("request req-1  completed")
    assert max(len(line) for line in lines) <= 80
    for stage in qwen_omni_topology().stages:
        assert any(line.startswith(stage) for line in lines), stage
    assert any("first text at decode" in line for line in lines)


def test_json_format(run_dir: Path) -> None:
    result = _run("req-0", "--run-dir", str(run_dir), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["request_id"] == "req-0"
    assert {"events", "spans"} <= set(document)
    assert len(document["events"]) == len(synthetic_request("req-0"))


def test_chrome_export(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = _run("req-2", "--run-dir", str(run_dir), "--export-chrome", str(out))
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    phases = {event["ph"] for event in document["traceEvents"]}
    assert {"X", "M", "s", "f"} <= phases
    assert document["otherData"]["request_id"] == "req-2"


def test_unknown_id_says_how_to_list_ids(run_dir: Path) -> None:
    result = _run("nope", "--run-dir", str(run_dir))
    assert result.exit_code == 1
    assert "no events for request 'nope'" in result.output
    assert "trace --last" in result.output  # after the program as invoked (tests/cli/test_invocation.py)


def test_last_and_slowest(run_dir: Path) -> None:
    last = _run("--last", "2", "--run-dir", str(run_dir))
    assert last.exit_code == 0, last.output
    ids = [line.split()[0] for line in last.output.splitlines()[2:]]
    assert ids == ["req-live", "req-2"]
    assert "in_flight" in last.output
    slowest = _run("--slowest", "2", "--run-dir", str(run_dir), "--format", "json")
    rows = json.loads(slowest.output)
    assert [row["request_id"] for row in rows] == ["req-1", "req-2"]
    assert rows[0]["duration_s"] > rows[1]["duration_s"]


@pytest.mark.parametrize("args", [(), ("req-1", "--last", "3"), ("--last", "3", "--slowest", "2")])
def test_exactly_one_of_id_last_slowest(run_dir: Path, args: tuple[str, ...]) -> None:
    result = _run(*args, "--run-dir", str(run_dir))
    assert result.exit_code == 2
    assert "Invalid value: give exactly one of REQUEST_ID, --last N, --slowest N" in result.output


def test_a_count_below_one_is_a_usage_error_naming_the_option(run_dir: Path) -> None:
    result = _run("--last", "0", "--run-dir", str(run_dir))
    assert result.exit_code == 2
    assert "Invalid value for '--last'" in result.output


def test_latest_run_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    missing = _run("--last", "1")
    assert missing.exit_code == 1 and "--run-dir" in missing.output
    store = TraceStore(default_run_dir())
    store.append(synthetic_request("only-one"))
    store.close()
    result = _run("--last", "5")
    assert result.exit_code == 0 and "only-one" in result.output


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_an_id_is_found_in_the_newest_run_that_recorded_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = runs_root()
    older, newer = root / f"20260101-080000-{_dead_pid()}", root / f"20260101-090000-{_dead_pid()}"
    for directory, ids in ((older, ["only-old", "both"]), (newer, ["both"])):
        store = TraceStore(directory)
        for request_id in ids:
            store.append(synthetic_request(request_id, work_ms=1.0 if directory == older else 3.0))
        store.close()
    store = TraceStore(default_run_dir())  # another program started since: `latest` points at it
    store.append(synthetic_request("someone-else"))
    store.close()
    result = _run("only-old")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"run {older}"
    assert _run("both").output.splitlines()[0] == f"run {newer}"
    missing = _run("nope")
    assert missing.exit_code == 1 and "3 recent runs under" in missing.output and "--run-dir" in missing.output
    assert f"no omnictl server answered at {NO_SERVER}" in " ".join(missing.output.split())


KEY = "sk-trace-test"


class _Health(http.server.BaseHTTPRequestHandler):
    """A server's /health as `omnictl serve` answers it: the run directory to the key only."""

    run_dir: Path

    def do_GET(self) -> None:
        keyed = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = {"status": "ok", "run_dir": str(self.run_dir)} if keyed else {"status": "ok"}
        data = json.dumps(body).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def server_url(run_dir: Path) -> Iterator[str]:
    handler = type("Health", (_Health,), {"run_dir": run_dir})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_running_servers_request_is_found_through_its_health(
    run_dir: Path, server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server records into its own --run-dir, not under the state directory: found all the same.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    found = _run("req-1", "--url", server_url, "--api-key", KEY)
    assert found.exit_code == 0, found.output
    assert found.output.splitlines()[0] == f"run {run_dir}"
    listed = _run("--last", "2", "--url", server_url, "--api-key", KEY)  # the same place for the list
    assert listed.exit_code == 0 and listed.output.splitlines()[0] == f"run {run_dir}", listed.output
    missing = _run("nope", "--url", server_url, "--api-key", KEY)
    text = " ".join(missing.output.split())
    assert missing.exit_code == 1
    assert f"the run of the server at {server_url} ({run_dir})" in text
    assert f"trace --last 20 --run-dir {run_dir}" in text  # the hint lists where the search looked


def test_a_server_that_keeps_its_run_directory_to_its_key_is_named(
    run_dir: Path, server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    result = _run("req-1", "--url", server_url)
    text = " ".join(result.output.split())
    assert result.exit_code == 1
    assert f"the server at {server_url} names its run directory only to its API key (--api-key)" in text


def test_runs_of_live_processes_are_never_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = runs_root()
    alive = root / f"20200101-000000-{os.getpid()}"  # the oldest, but its server still runs
    dead = [root / f"2021010{day}-000000-{_dead_pid()}" for day in range(1, 5)]
    for directory in (alive, *dead):
        directory.mkdir(parents=True)
    current = default_run_dir(keep=2)
    left = set(default_runs())
    assert alive in left and current in left and dead[-1] in left
    assert not (set(dead[:-1]) & left), "older runs of exited processes are pruned"


def test_importing_the_command_stays_light() -> None:
    code = "import sys, omnictl.cli.trace; print(any(m in sys.modules for m in ('torch', 'rich', 'zmq')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_tensor_parallel_stage_is_one_row_and_its_ranks_are_named(tmp_path: Path) -> None:
    import dataclasses

    topology = qwen_omni_topology()
    stages = dict(topology.stages)
    stages["talker"] = dataclasses.replace(stages["talker"], gpu=(1, 2), tp_size=2)
    stages["thinker"] = dataclasses.replace(stages["thinker"], gpu=(), tp_size=3)
    directory = tmp_path / "run"
    write_run_info(directory, dataclasses.replace(topology, stages=stages))
    store = TraceStore(directory)
    store.append(synthetic_request("req-tp", start_ns=1000 * MS, work_ms=2.0))
    store.close()
    result = CliRunner().invoke(_app(), ["trace", "req-tp", "--run-dir", str(directory)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len([line for line in lines if line.startswith("talker ")]) == 1  # the group is one row
    groups = [line for line in lines if line.startswith("tensor-parallel groups")]
    assert groups == ["tensor-parallel groups (one row each): thinker on 3 CPU ranks; talker on 2 ranks on GPUs 1,2"]


@pytest.mark.slow  # launches the parrot example's two stage processes (~3 s)
def test_omnictl_run_says_where_it_records_and_trace_reads_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    import omnictl

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    topology = Path(__file__).resolve().parents[2] / "examples" / "parrot" / "topology.yaml"
    with caplog.at_level(logging.INFO, logger="omnictl.pipeline"):
        results = omnictl.run(topology, {"messages": [{"role": "user", "content": "hello"}]})
    assert results["show"].text == "hello"
    said = [r.getMessage() for r in caplog.records if "recording this run's traces and logs in" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    (run,) = default_runs()
    assert str(run) in said[0] and run.is_relative_to(tmp_path / "state")
    listed = _run("--last", "1")
    assert listed.exit_code == 0 and listed.output.splitlines()[0] == f"run {run}", listed.output
