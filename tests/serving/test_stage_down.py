"""Stage processes that die: open streams end with an error event, /health turns 503, new requests fail fast."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import httpx

from tests.serving.harness import API_KEY, FAST_TOPOLOGY, ServerProcess, start_server, stop_server, wait_until


def test_a_dead_stage_makes_health_503_and_requests_fail_fast() -> None:
    server = start_server(str(FAST_TOPOLOGY))
    try:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        children = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", "omnictl.stage.worker"],
                                  capture_output=True, text=True).stdout.split()
        assert len(children) == 2, "the fast topology runs two stage processes"
        body = {"messages": [{"role": "user", "content": "answer slowly"}], "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as streaming:
            lines = streaming.iter_lines()
            next(line for line in lines if '"content":"echo:"' in line)
            for child in children:  # mid-answer, every stage process dies
                os.kill(int(child), signal.SIGKILL)
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]" and "error" in json.loads(rest[-2])

        def all_down() -> httpx.Response | None:
            response = httpx.get(server.url + "/health", timeout=10)
            return response if response.status_code == 503 and len(response.json()["down"]) == 3 else None

        body = wait_until(all_down).json()
        assert body["status"] == "down" and body["down"] == ["answer", "prep", "speak"]
        response = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                              json={"messages": [{"role": "user", "content": "anyone there?"}]})
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "pipeline_dead"
        # Which of the two processes is named depends on which death was noticed last.
        assert re.fullmatch(r"the pipeline is down: stage process '\w+' \(stages (prep|answer, speak)\) died: killed by SIGKILL",
                            error["message"]), error["message"]
    finally:
        assert stop_server(server) == 0


def test_a_frozen_stage_process_makes_health_503_naming_it_until_it_resumes(server: ServerProcess) -> None:
    """On the session's shared server (the fast topology): the process is resumed and the
    server healthy again before the test ends, so nothing of it is left for the next one."""
    key = {"Authorization": f"Bearer {API_KEY}"}  # /health's details need the key
    children = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", "omnictl.stage.worker"],
                              capture_output=True, text=True).stdout.split()
    frozen = int(children[0])
    try:
        assert httpx.get(server.url + "/health", headers=key, timeout=10).status_code == 200
        os.kill(frozen, signal.SIGSTOP)
        response = httpx.get(server.url + "/health", headers=key, timeout=10)
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "unresponsive" and len(body["unresponsive"]) == 1
        assert body["processes"][body["unresponsive"][0]] == frozen
        os.kill(frozen, signal.SIGCONT)
        wait_until(lambda: httpx.get(server.url + "/health", headers=key, timeout=10).status_code == 200)
    finally:
        os.kill(frozen, signal.SIGCONT)
