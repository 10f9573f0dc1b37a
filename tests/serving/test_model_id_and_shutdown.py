"""The served model id (the topology's name, plus aliases) and Ctrl-C with a stream open,
against a real `omnictl serve`."""

from __future__ import annotations

import json
import signal
import shutil
import threading
from pathlib import Path

import httpx

from tests.serving.harness import FAST_TOPOLOGY, STOP_TIMEOUT_S, start_server, stop_server


def ask(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)


def test_the_model_id_is_the_topology_name_and_others_are_404(tmp_path: Path) -> None:
    renamed = tmp_path / "my-renamed-file.yaml"  # the file's name is not the model's
    shutil.copy(FAST_TOPOLOGY, renamed)
    server = start_server(str(renamed), "--served-model-name", "gpt-4o-mini")
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["fast", "gpt-4o-mini"]
        assert ask(server.url, "fast").status_code == 200
        assert ask(server.url, "gpt-4o-mini").json()["model"] == "gpt-4o-mini"
        missing = ask(server.url, "my-renamed-file")
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert (error["code"], error["type"], error["param"]) == ("model_not_found", "invalid_request_error", "model")
        assert "'my-renamed-file'" in error["message"] and "'fast'" in error["message"]
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'omnictl_requests_total{outcome="rejected"} 1.0' in metrics
    finally:
        assert stop_server(server) == 0


def test_ctrl_c_ends_an_open_stream_with_an_error_event_and_done() -> None:
    server = start_server(str(FAST_TOPOLOGY))
    body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "answer slowly"}]}
    events: list[str] = []
    try:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:  # wait for the first words: the request is mid-stream
                if line.startswith("data: ") and '"content"' in line:
                    break
            threading.Timer(0.1, server.process.send_signal, (signal.SIGINT,)).start()
            events = [line for line in lines if line.startswith("data: ")]
    finally:
        assert server.process.wait(STOP_TIMEOUT_S) == 0, server.text()
    assert events[-1] == "data: [DONE]", events[-3:]
    error = json.loads(events[-2][len("data: "):])["error"]
    assert error["code"] == "server_shutdown" and "shutting down" in error["message"]


def test_sigterm_with_several_streams_ends_each_properly_and_logs_no_traceback() -> None:
    server = start_server(str(FAST_TOPOLOGY))
    body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "answer slowly"}]}
    endings: list[list[str]] = []
    started = threading.Barrier(5)

    def one() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: ") and '"content"' in line:
                    break
            started.wait(30)
            endings.append([line for line in lines if line.startswith("data: ")])

    threads = [threading.Thread(target=one) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        started.wait(30)
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(30)
    finally:
        assert server.process.wait(STOP_TIMEOUT_S) == 0, server.text()
    assert len(endings) == 4
    for events in endings:
        assert events[-1] == "data: [DONE]", events[-3:]
        assert json.loads(events[-2][len("data: "):])["error"]["code"] == "server_shutdown"
    assert "Traceback" not in server.text(), server.text()
