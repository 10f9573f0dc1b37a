"""Admission control: the library (asyncio), the Python API, and over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

import omnictl
from omnictl.admission import Admission
from tests.serving.harness import FAST_TOPOLOGY, start_server, stop_server, wait_until
from tests.serving.realtime.speech import collect_until_done
from tests.support import topo
from tests.support.loop import LoopThread, launch


def test_over_the_limit_is_refused_at_once_and_a_release_admits_again() -> None:
    async def scenario() -> None:
        admission = Admission(max_in_flight=2)
        first, second = await admission.admit(), await admission.admit()
        started = time.monotonic()
        with pytest.raises(omnictl.Overloaded) as caught:
            await admission.admit()
        assert time.monotonic() - started < 0.05 and caught.value.retry_after >= 1
        first.release()
        first.release()  # idempotent: frees one slot, once
        third = await admission.admit()
        assert admission.in_flight == 2 and admission.refused == 1
        second.release(), third.release()
        assert admission.in_flight == 0

    asyncio.run(scenario())


def test_waiters_get_freed_slots_in_order_or_time_out() -> None:
    async def scenario() -> None:
        admission = Admission(max_in_flight=1, max_queue_wait=0.3)
        held = await admission.admit()
        waiting = asyncio.create_task(admission.admit())
        await asyncio.sleep(0.05)
        assert admission.queued == 1
        held.release()
        handed = await waiting
        assert admission.in_flight == 1 and admission.queued == 0
        started = time.monotonic()
        with pytest.raises(omnictl.AdmissionTimeout):
            await admission.admit()
        assert 0.25 < time.monotonic() - started < 1.0 and admission.queued == 0
        leaving = asyncio.create_task(admission.admit())
        await asyncio.sleep(0.05)
        leaving.cancel()  # the client left while waiting: no slot is lost
        await asyncio.gather(leaving, return_exceptions=True)
        handed.release()
        assert admission.in_flight == 0 and admission.queued == 0

    asyncio.run(scenario())


def test_the_python_api_raises_overloaded_and_frees_the_slot_when_a_request_ends(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(tmp_path / "slow.yaml", [{"name": "a", "factory": "omnictl.models.examples.sleep",
                                                "factory_args": {"seconds": 0.5}, "terminal": True}])
    pipe = launch(loop, path, profile=False, max_in_flight=1)
    try:
        first = loop.run(pipe.submit({"x": 1}))
        with pytest.raises(omnictl.Overloaded):
            loop.run(pipe.submit({"x": 2}))
        loop.run(first.result())
        assert loop.run(loop_result(pipe, {"x": 3})) == {"a": {"x": 3}}
        assert pipe.admission.in_flight == 0
    finally:
        loop.run(pipe.close())


async def loop_result(pipe: omnictl.Pipeline, data: dict[str, int]) -> dict[str, object]:
    return await (await pipe.submit(data)).result()


SLOW = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "answer slowly"}]}
QUICK = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


def _hold_a_stream(url: str, started: threading.Event, release: threading.Event, lines: list[str]) -> None:
    with httpx.stream("POST", url + "/v1/chat/completions", json=SLOW, timeout=60) as response:
        for line in response.iter_lines():
            started.set()
            if line:
                lines.append(line)
            if release.is_set():
                return  # the client leaves mid-stream: the server aborts it and frees the slot


@dataclass
class Held:
    """A server whose one in-flight slot a slow stream holds until ``release()``."""

    url: str
    lines: list[str]
    holder: threading.Thread
    _release: threading.Event

    def release(self) -> None:
        """Leave the stream and wait until its slot is given back (a quick chat is answered)."""
        self._release.set()
        self.holder.join(30)
        assert not self.holder.is_alive()
        wait_until(lambda: httpx.post(self.url + "/v1/chat/completions", json=QUICK, timeout=30).status_code == 200)


def _server(*serve_args: str) -> Iterator[str]:
    server = start_server(str(FAST_TOPOLOGY), "--max-in-flight", "1", *serve_args)
    try:
        yield server.url
    finally:
        assert stop_server(server) == 0


# One server for the module's tests (starting one costs seconds); each test holds its slot
# with a slow stream and gives it back by leaving it, rather than waiting out the stream
# (~13 s), so the next test finds the slot free.
@pytest.fixture(scope="module")
def one_slot() -> Iterator[str]:
    yield from _server()


@pytest.fixture  # one test uses it: its start-up is that test's own time (tests/conftest.py)
def one_slot_short_wait() -> Iterator[str]:
    yield from _server("--max-queue-wait", "0.5")


@contextlib.contextmanager
def one_slot_held(url: str) -> Iterator[Held]:
    started, release, lines = threading.Event(), threading.Event(), []
    holder = threading.Thread(target=_hold_a_stream, args=(url, started, release, lines))
    holder.start()
    held = Held(url, lines, holder, release)
    try:
        assert started.wait(30)
        yield held
    finally:
        held.release()


def _rejections(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=10).text
    line = next((x for x in metrics.splitlines() if x.startswith('omnictl_admission_rejections_total{reason="over_limit"}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_http_over_the_limit_is_429_with_retry_after_while_the_admitted_one_goes_on(one_slot: str) -> None:
    refused_before = _rejections(one_slot)
    with one_slot_held(one_slot) as held:
        begun = time.monotonic()
        refused = httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30)
        assert refused.status_code == 429 and time.monotonic() - begun < 1.0
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        seen = len(held.lines)
        wait_until(lambda: len(held.lines) >= seen + 2)  # the admitted stream goes on, untouched
        assert all("error" not in json.loads(line[6:]) for line in held.lines if line != "data: [DONE]")
        assert _rejections(one_slot) == refused_before + 1
        assert "omnictl_admission_queue_depth 0.0" in httpx.get(held.url + "/metrics", timeout=10).text
    assert httpx.post(one_slot + "/v1/chat/completions", json=QUICK, timeout=30).status_code == 200


def test_http_a_request_that_waits_too_long_for_admission_is_503(one_slot_short_wait: str) -> None:
    with one_slot_held(one_slot_short_wait) as held:
        begun = time.monotonic()
        waited = httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30)
        assert waited.status_code == 503 and 0.4 < time.monotonic() - begun < 5
        assert waited.json()["error"]["code"] == "queue_timeout" and waited.headers["retry-after"]


def test_realtime_over_the_limit_gets_an_overloaded_error_event_and_the_session_goes_on(one_slot: str) -> None:
    client = openai.OpenAI(base_url=one_slot + "/v1", api_key="unused", max_retries=0)
    with client.realtime.connect(model="fast") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        assert connection.recv().type == "session.updated"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        connection.conversation.item.create(item=item)
        with one_slot_held(one_slot):
            connection.response.create()
            events = collect_until_done(connection)
            errors = [e.error for e in events if e.type == "error"]
            assert [e.code for e in errors] == ["overloaded"] and errors[0].type == "rate_limit_error"
            assert events[-1].response.status == "failed"
        connection.response.create()  # the slot is free again: the same session is answered
        assert collect_until_done(connection)[-1].response.status == "completed"


def test_http_over_the_limit_is_refused_before_its_body_is_read(one_slot: str) -> None:
    """A 429 costs no read of the body: a client that declares 1 MB and sends none of it
    is refused at once (reading first, it would wait out the body timeout: 408 after 30 s)."""
    with one_slot_held(one_slot) as held:
        host, port = held.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            status_line = conn.recv(4096).split(b"\r\n", 1)[0]
        assert status_line == b"HTTP/1.1 429 Too Many Requests", status_line
