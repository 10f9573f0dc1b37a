"""`omnictl bench --url` against a running server: the table, --json, --compare, exit codes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from omnictl.cli.main import app
from tests.serving.harness import API_KEY, ServerProcess


@pytest.fixture(scope="module")
def server(fast_server: ServerProcess) -> ServerProcess:
    """The run's shared fast server (tests/conftest.py): it takes an API key, which the
    bench sends (``--api-key``) for /health's details, where its trace store is named."""
    return fast_server


def bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "160", "OMNICTL_API_KEY": API_KEY})
    return result.exit_code, result.output


def test_bench_json_and_compare(server: ServerProcess, tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    code, output = bench("--url", server.url, "-n", "8", "--warmup", "1", "--concurrency", "2",
                         "--modalities", "text", "--json", str(first), "--no-progress")
    assert code == 0, output
    assert "8 / 0" in output and "time to first text" in output and "prep->answer" in output
    result = json.loads(first.read_text())
    assert result["summary"]["completed"] == 8 and result["latency"]["ttfa"]["count"] == 0  # text only
    # on the same machine the bench finds the server's trace store through /health
    assert result["breakdown"]["source"] == "trace_store"
    assert set(result["breakdown"]["stages"]) == {"prep", "answer"}  # a text-only request never runs `speak`

    code, output = bench("--url", server.url, "-n", "6", "--warmup", "0", "--rate", "20",
                         "--modalities", "text,audio", "--compare", str(first), "--no-progress")
    assert code == 0, output
    assert "compared with the earlier run" in output
    assert "the runs differ in" in output and "modalities" in output and "rate" in output
    assert "time to first text p50 (ms)" in output


def test_compare_with_a_file_that_is_not_a_result_fails_first(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}')
    code, output = bench("--url", "http://127.0.0.1:9", "--compare", str(bogus))
    assert code == 2 and "not an omnictl bench result" in output


def test_a_dead_url_fails_at_once_in_one_line() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, output = bench("--url", f"http://127.0.0.1:{port}", "-n", "3", "--warmup", "0", "--no-progress")
    assert code == 2
    assert output.strip().count("\n") == 0, output
    assert output.startswith(f"error: cannot reach http://127.0.0.1:{port}")


def test_a_server_that_rejects_every_request_is_reported(server: ServerProcess) -> None:
    code, output = bench("--url", server.url, "--modalities", "text", "--input", "text", "--max-tokens", "0",
                         "--no-progress")
    assert code == 2
    assert "rejects" in output and "max_tokens" in output
