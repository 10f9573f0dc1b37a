"""`omnictl serve` as a user meets it: the ready message, its curl example, Ctrl-C, bad arguments."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import pytest

from tests.serving.harness import API_KEY, FAST_TOPOLOGY, REPO, ServerProcess, start_server, stop_server

# Longer than the suite's default deadline: `omnictl serve` started for real, up to ~7 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)

SKIP_SLOW = os.environ.get("OMNICTL_SKIP_SLOW") == "1"


def run_serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "omnictl.cli.main", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_printed_curl_command_works_as_written(fast_server: ServerProcess, tmp_path: Path) -> None:
    """On the run's one fast server (tests/conftest.py, which also checks that Ctrl-C stops it
    cleanly): it takes an API key, so its curl reads the key from $OMNICTL_API_KEY, the
    variable serve takes a key from. The keyless form is run as printed by the quick-start
    test below, and both forms are pinned by tests/serving/test_ready.py."""
    text = fast_server.text()
    assert f"listening on {fast_server.url}" in text
    command = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl "))
    answer = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "OMNICTL_API_KEY": API_KEY})
    assert answer.returncode == 0, answer.stderr
    assert "echo: What is the capital of France?" in answer.stdout
    with wave.open(io.BytesIO((tmp_path / "answer.wav").read_bytes())) as wav:
        assert wav.getnframes() > 0  # the spoken answer


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_serve(str(FAST_TOPOLOGY), "--port", str(port), "--no-dashboard")
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: port {port} is in use (try --port 0)"


@pytest.mark.slow  # imports the Qwen3-Omni stack before it can refuse
def test_a_qwen_topology_without_model_path_is_one_line_naming_the_option() -> None:
    result = run_serve(str(REPO / "topologies" / "qwen3-omni-text.yaml"), "--device", "cpu", "--port", "0",
                       "--no-dashboard", timeout=300)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stage ") and "--model-path DIR" in lines[0], lines
    assert "Traceback" not in result.stdout + result.stderr


def test_an_unforeseen_start_up_failure_is_one_line_and_the_traceback_goes_to_a_log(tmp_path: Path) -> None:
    (tmp_path / "broken_stage.py").write_text("def make():\n    raise RuntimeError('no such device: npu7')\n")
    topology = tmp_path / "broken.yaml"
    topology.write_text("name: broken\nstages:\n  - {name: only, factory: broken_stage.make, terminal: true}\n")
    result = subprocess.run([sys.executable, "-m", "omnictl.cli.main", "serve", str(topology), "--port", "0",
                             "--no-dashboard"], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == "error: stage 'only' failed to start: its factory raised: RuntimeError: no such device: npu7"
    log = Path(lines[1].split(" is in ", 1)[1])
    assert log.is_file() and "Traceback" in log.read_text() and "broken_stage.py" in log.read_text()
    assert "Traceback" not in result.stdout + result.stderr


def test_a_missing_topology_is_a_clear_error(tmp_path: Path) -> None:
    result = run_serve(str(tmp_path / "nope.yaml"), "--port", "0", "--no-dashboard")
    assert result.returncode != 0
    assert "nope.yaml" in result.stdout + result.stderr


def test_a_misspelt_factory_is_reported_at_its_line_before_any_stage_starts(tmp_path: Path) -> None:
    (tmp_path / "mystages.py").write_text("def make_a():\n    return lambda d: d\n")
    topology = tmp_path / "t.yaml"
    topology.write_text("name: t\nstages:\n  - name: a\n    factory: mystages.make_a\n    next: [b]\n"
                        "  - name: b\n    factory: mystages.mak_b\n    terminal: true\n")
    result = run_serve(str(topology), "--port", "0", "--no-dashboard")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"{topology}:7:14: import: stage 'b': `factory`" in out and "defines no 'mak_b'" in out
    assert "traceback" not in out and "started" not in out  # no stage process was launched


@pytest.mark.slow
@pytest.mark.timeout(900)  # the real quick start, about a minute; its own deadlines allow a cold first start
@pytest.mark.skipif(SKIP_SLOW, reason="OMNICTL_SKIP_SLOW=1: skips the real voice-assistant quick start")
def test_default_serve_answers_the_printed_curl_with_speech_and_bench_measures_it(tmp_path: Path) -> None:
    """The README quick start: `omnictl serve`, the curl it prints, then `omnictl bench` against it."""
    server = start_server(ready_timeout=900)
    try:
        command = next(line.strip() for line in server.text().splitlines() if line.strip().startswith("curl "))
        answer = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert answer.returncode == 0, answer.stderr
        assert re.search(r"paris", answer.stdout, re.IGNORECASE)
        with wave.open(str(tmp_path / "answer.wav")) as wav:
            assert wav.getnframes() / wav.getframerate() > 0.5  # at least half a second of speech
        # `omnictl bench` run in this process (the command itself, as tests/cli/test_bench.py runs
        # it), where it was an interpreter of its own importing omnictl
        from typer.testing import CliRunner

        from omnictl.cli.main import app

        bench = CliRunner().invoke(app, ["bench", "--url", server.url, "-n", "2", "--warmup", "0", "--input", "mixed",
                                         "--max-tokens", "16", "--no-progress"], env={"COLUMNS": "160"})
        assert bench.exit_code == 0, bench.output
        assert "2 / 0" in bench.output and "time to first audio" in bench.output and "thinker" in bench.output
    finally:
        assert stop_server(server) == 0


LOADING_STAGE = '''
from huggingface_hub.utils import tqdm


def load():
    for _ in tqdm(range(50), desc="Loading weights"):  # what transformers shows while loading
        pass
    return lambda data: data
'''


def test_loading_prints_one_line_per_stage_no_progress_bars_and_the_run_directory(tmp_path: Path) -> None:
    (tmp_path / "loading_stage.py").write_text(LOADING_STAGE)
    topology = tmp_path / "loading.yaml"
    topology.write_text("name: loading\nstages:\n"
                        "  - {name: first, factory: loading_stage.load, next: [second]}\n"
                        "  - {name: second, factory: loading_stage.load, process: other, terminal: true,"
                        " modality: text}\n")
    server = start_server(str(topology))
    try:
        text = server.text()
    finally:
        assert stop_server(server) == 0
    assert "Loading weights" not in text
    assert re.search(r"stage 'first' loaded in \d+\.\d s \(process first\)", text)
    assert re.search(r"stage 'second' loaded in \d+\.\d s \(process other\)", text)
    traces = re.search(r"traces in (\S+)", text)
    assert traces and (Path(traces.group(1)) / "run.json").is_file(), text


def _serve_in_process(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, list[Any]]:
    """``omnictl serve ARGS`` in this process, the server itself left out: (the result, the
    configs it would have served)."""
    import typer
    from typer.testing import CliRunner

    from omnictl import logs, serving
    from omnictl.cli.serve import register

    served: list[Any] = []
    monkeypatch.setattr(serving, "serve", lambda config, on_ready: served.append(config))  # the one unit left out
    monkeypatch.setattr(logs, "configure", lambda level, format: None)  # this process's logging stays the test's
    monkeypatch.delenv("OMNICTL_API_KEY", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # keeps `serve` a subcommand, as in `omnictl`
        """omnictl"""

    register(app)
    return CliRunner().invoke(app, ["serve", *args], env={"COLUMNS": "200"}), served


def test_the_command_maps_every_option_onto_one_config_and_serves_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnictl.launch_config import LaunchConfig
    from omnictl.serving.chat.protocol import Limits
    from omnictl.serving.config import HttpConfig, ServeConfig

    args = ["t.yaml", "--host", "127.0.0.2", "--port", "0", "--model-path", "/models/x", "--device", "cpu",
            "--api-key", "k", "--run-dir", str(tmp_path), "--request-timeout", "12.5", "--max-restarts", "3",
            "--replay-limit", "2", "--max-in-flight", "7", "--max-queue-wait", "1.5",
            "--otlp-endpoint", "http://127.0.0.1:4318", "--launcher", "ray", "--ray-address", "127.0.0.1:6379",
            "--data-host", "127.0.0.1", "--audio-policy", "deadline", "--max-underrun-ms", "80",
            "--served-model-name", "alias", "--allowed-origins", "http://a:1", "--allowed-hosts", "box",
            "--max-body-mb", "1", "--max-audio-mb", "2", "--body-timeout", "3", "--header-timeout", "4",
            "--max-connections", "50", "--max-realtime-sessions", "5", "--max-connecting-calls", "2",
            "--call-connect-timeout", "6", "--live-transcriber", "asr.yaml"]
    result, served = _serve_in_process(monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert served == [ServeConfig(
        topology=Path("t.yaml"),
        http=HttpConfig(host="127.0.0.2", port=0, api_key="k", served_model_names=("alias",),
                        allowed_origins=("http://a:1",), allowed_hosts=("box",)),
        launch=LaunchConfig.of(model_path="/models/x", device="cpu", run_dir=tmp_path, profile=True,
                               request_timeout=12.5, max_restarts=3, replay_limit=2, max_in_flight=7,
                               max_queue_wait=1.5, otlp_endpoint="http://127.0.0.1:4318/v1/traces", launcher="ray",
                               ray_address="127.0.0.1:6379", data_host="127.0.0.1", audio_policy="deadline"),
        limits=Limits(1024 * 1024, 2 * 1024 * 1024, body_timeout_s=3.0, header_timeout_s=4.0, max_connections=50,
                      max_realtime_sessions=5, max_realtime_connecting=2, realtime_connect_timeout_s=6.0),
        max_underrun_ms=80.0,
        live_transcriber=Path("asr.yaml"),
    )]
    result, served = _serve_in_process(monkeypatch)
    assert result.exit_code == 0, result.output
    assert served == [ServeConfig()]  # the flags' defaults are the config's: a server admits 64 at once
    assert served[0].launch.admission.max_in_flight == 64


@pytest.mark.parametrize(("args", "message"), [
    (["--audio-policy", "loudest"], "error: audio_policy must be one of fifo, deadline, got 'loudest'"),
    (["--request-timeout", "0"], "error: request_timeout must be > 0 seconds, not 0.0"),
])
def test_a_value_the_config_refuses_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    result, served = _serve_in_process(monkeypatch, *args)
    assert result.exit_code == 2 and served == []
    assert message in result.output
