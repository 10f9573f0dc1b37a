"""Admission by continuity: with a stage slowed on purpose, a new audio request gets 429
while text-only requests still pass (``serve --max-underrun-ms``)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import pytest

from tests.serving.fast_stages import SLOW_CHUNK_S
from tests.serving.harness import FAST_TOPOLOGY, ServerProcess, start_server, stop_server, wait_until


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    running = start_server(str(FAST_TOPOLOGY), "--max-underrun-ms", "100")
    yield running
    assert stop_server(running) == 0, running.text()


def chat(server: ServerProcess, text: str, audio: bool, timeout: float = 30) -> httpx.Response:
    body = {"model": "fast", "messages": [{"role": "user", "content": text}], "stream": True,
            "modalities": ["text", "audio"] if audio else ["text"], "audio": {"voice": "alloy", "format": "pcm16"}}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=timeout)


def test_a_new_audio_stream_is_refused_while_a_slow_one_plays_and_text_still_passes(server: ServerProcess) -> None:
    # The word "slowly" makes the fast topology's speaker send a 0.1 s tone every 0.3 s: its
    # listener already waits 0.2 s per chunk; a second stream would stretch that further.
    chunks: list[float] = []
    stop = threading.Event()

    def play() -> None:
        body = {"model": "fast", "messages": [{"role": "user", "content": "say it slowly"}], "stream": True,
                "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if '"audio"' in line:
                    chunks.append(time.perf_counter())
                if stop.is_set():
                    break

    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        wait_until(lambda: len(chunks) >= 3, timeout=30)  # playing, with a measured pace
        started = time.perf_counter()
        refused = chat(server, "hello there", audio=True)
        took = time.perf_counter() - started
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "audio_underrun" and "--max-underrun-ms 100" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert took < 0.5  # refused at once (the benchmark checks the < 50 ms goal on an idle machine)
        # admitted: its stream opens (its words wait behind the slow answer's at the stage)
        body = {"model": "fast", "messages": [{"role": "user", "content": "hello there"}], "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as text_only:
            assert text_only.status_code == 200
            assert next(line for line in text_only.iter_lines() if line).startswith("data: ")
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'omnictl_admission_rejections_total{reason="underrun"} 1.0' in metrics
    finally:
        stop.set()
        player.join(timeout=SLOW_CHUNK_S * 60)
    # once the slow stream has gone, audio is admitted again
    wait_until(lambda: chat(server, "again", audio=True).status_code == 200, timeout=20)
