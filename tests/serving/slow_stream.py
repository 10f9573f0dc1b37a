"""A slowed audio stream playing in the background: the stream admission by continuity protects."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import httpx

from tests.serving.fast_stages import SLOW_CHUNK_S
from tests.serving.harness import ServerProcess, wait_until


@contextlib.contextmanager
def slow_stream_playing(server: ServerProcess, words: int | None = None) -> Iterator[list[float]]:
    """Stream "say it slowly" from the fast topology (its speaker sends a 0.1 s tone every 0.3 s,
    so its listener already waits 0.2 s per chunk) and yield, once three chunks have come, the
    times its audio chunks arrived; the stream is dropped on leaving. ``words``: its length
    (its max_tokens: 0.3 s each; 44 by default), where a test waits behind it in the stages."""
    chunks: list[float] = []
    stop = threading.Event()

    def play() -> None:
        body = {"model": "fast", "messages": [{"role": "user", "content": "say it slowly"}], "stream": True,
                "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        if words is not None:
            body["max_tokens"] = words
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
        yield chunks
    finally:
        stop.set()
        player.join(timeout=SLOW_CHUNK_S * 60)
