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


def _hold_a_stream(url: str, started: threading.Event, lines: list[str]) -> None:
    with httpx.stream("POST", url + "/v1/chat/completions", json=SLOW, timeout=60) as response:
        for line in response.iter_lines():
            started.set()
            if line:
                lines.append(line)


@dataclass
class Held:
    """A server whose one in-flight slot a slow stream holds (``holder``)."""

    url: str
    lines: list[str]
    holder: threading.Thread


@contextlib.contextmanager
def one_slot_held(*serve_args: str) -> Iterator[Held]:
    server = start_server(str(FAST_TOPOLOGY), "--max-in-flight", "1", *serve_args)
    try:
        started, lines = threading.Event(), []
        holder = threading.Thread(target=_hold_a_stream, args=(server.url, started, lines))
        holder.start()
        assert started.wait(30)
        yield Held(server.url, lines, holder)
    finally:
        assert stop_server(server) == 0


def test_http_over_the_limit_is_429_with_retry_after_while_the_admitted_one_completes() -> None:
    with one_slot_held() as held:
        begun = time.monotonic()
        refused = httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30)
        assert refused.status_code == 429 and time.monotonic() - begun < 1.0
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        held.holder.join(60)
        assert held.lines[-1] == "data: [DONE]" and "error" not in json.loads(held.lines[-2][6:])  # the admitted one completed
        assert httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30).status_code == 200
        metrics = httpx.get(held.url + "/metrics", timeout=10).text
        assert 'omnictl_admission_rejections_total{reason="over_limit"} 1.0' in metrics
        assert "omnictl_admission_queue_depth 0.0" in metrics


def test_http_a_request_that_waits_too_long_for_admission_is_503() -> None:
    with one_slot_held("--max-queue-wait", "0.5") as held:
        begun = time.monotonic()
        waited = httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30)
        assert waited.status_code == 503 and 0.4 < time.monotonic() - begun < 5
        assert waited.json()["error"]["code"] == "queue_timeout" and waited.headers["retry-after"]
        held.holder.join(60)
        wait_until(lambda: httpx.post(held.url + "/v1/chat/completions", json=QUICK, timeout=30).status_code == 200)


def test_realtime_over_the_limit_gets_an_overloaded_error_event_and_the_session_goes_on() -> None:
    with one_slot_held() as held:
        client = openai.OpenAI(base_url=held.url + "/v1", api_key="unused", max_retries=0)
        with client.realtime.connect(model="fast") as connection:
            assert connection.recv().type == "session.created"
            connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            assert connection.recv().type == "session.updated"
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            connection.conversation.item.create(item=item)
            connection.response.create()
            events = collect_until_done(connection)
            errors = [e.error for e in events if e.type == "error"]
            assert [e.code for e in errors] == ["overloaded"] and errors[0].type == "rate_limit_error"
            assert events[-1].response.status == "failed"
            held.holder.join(60)
            connection.response.create()  # the slot is free again: the same session is answered
            assert collect_until_done(connection)[-1].response.status == "completed"


def test_http_over_the_limit_is_refused_before_its_body_is_read() -> None:
    """A 429 costs no read of the body: a client that declares 1 MB and sends none of it
    is refused at once (reading first, it would wait out the body timeout: 408 after 30 s)."""
    with one_slot_held() as held:
        host, port = held.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            status_line = conn.recv(4096).split(b"\r\n", 1)[0]
        assert status_line == b"HTTP/1.1 429 Too Many Requests", status_line
        held.holder.join(60)
