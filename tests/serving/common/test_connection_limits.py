"""Connection limits (issue 24, bugs 6 and 10): idle sockets cannot exhaust the server,
and a frozen stage process gets fast 503s instead of requests that hang.

A real `omnictl serve` under a 1,024 open-files limit, and the connection guard's
protocol classes under a real uvicorn server; all traffic on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import threading
import time
from typing import Any, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.serving.harness import FAST_TOPOLOGY, ServerProcess, start_server, stop_server, wait_until

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    running = start_server(str(FAST_TOPOLOGY), "--request-timeout", "30", open_files=1024)
    yield running
    assert stop_server(running) == 0, running.text()


def _address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def test_1100_idle_connections_under_a_1024_file_limit_leave_a_new_client_served(limited: ServerProcess) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"this test process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300) if hard == resource.RLIM_INFINITY else max(soft, min(hard, 4096)), hard))
    idle: list[socket.socket] = []
    try:
        for i in range(1100):
            conn = socket.create_connection(_address(limited), timeout=10)
            if i % 2:
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers begun, never finished
            idle.append(conn)
        time.sleep(1.0)  # the server accepts them all (and closes the oldest idle ones past its cap)
        started = time.monotonic()
        with httpx.Client(timeout=20) as client:
            assert client.get(limited.url + "/health").status_code == 200
            assert client.post(limited.url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert time.monotonic() - started < 10
    finally:
        for conn in idle:
            conn.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Traceback" not in limited.text(), limited.text()[-3000:]
    assert limited.text().count("out of system resource") <= 1


def test_a_frozen_stage_process_gets_fast_503s_naming_it(limited: ServerProcess) -> None:
    """Bug 10: /health said `unresponsive`, but admission still sent requests there to hang 300 s."""
    with httpx.Client(timeout=20) as client:
        pid = client.get(limited.url + "/health").json()["processes"]["heads"]
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: client.get(limited.url + "/health").json().get("unresponsive") == ["heads"], timeout=20)
            for _ in range(5):
                started = time.monotonic()
                answer = client.post(limited.url + "/v1/chat/completions", json=CHAT)
                assert answer.status_code == 503 and answer.json()["error"]["code"] == "stage_unresponsive", answer.text
                assert "'heads'" in answer.json()["error"]["message"]
                assert time.monotonic() - started < 2
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: client.post(limited.url + "/v1/chat/completions", json=CHAT).status_code == 200, timeout=20)


# --- the guard's protocols, under a real uvicorn server in this process ---------------------------------


@contextlib.contextmanager
def guarded_server(max_connections: int, header_timeout_s: float) -> Iterator[tuple[tuple[str, int], Any]]:
    from omnictl.serving.common.connections import ConnectionGuard

    guard = ConnectionGuard(max_connections, header_timeout_s)
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", http=guard.http_protocol(),  # type: ignore[arg-type]
                            ws=guard.websocket_protocol())  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=10)
        yield sock.getsockname(), guard
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()
        sock.close()


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_a_connection_that_never_finishes_its_headers_is_closed() -> None:
    with guarded_server(max_connections=100, header_timeout_s=0.5) as (address, guard):
        silent = socket.create_connection(address)
        partial = socket.create_connection(address)
        partial.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            assert _closed_by_server(silent, 10) and _closed_by_server(partial, 10)
            assert guard.timed_out == 2
            assert httpx.get(f"http://{address[0]}:{address[1]}/", timeout=10).text == "ok"  # a real client is served
        finally:
            silent.close()
            partial.close()


def test_at_the_cap_the_oldest_idle_connection_makes_room() -> None:
    with guarded_server(max_connections=4, header_timeout_s=60) as (address, guard):
        idle = [socket.create_connection(address) for _ in range(4)]
        try:
            wait_until(lambda: guard.open == 4, timeout=10)
            assert httpx.get(f"http://{address[0]}:{address[1]}/", timeout=10).text == "ok"
            assert guard.evicted >= 1 and _closed_by_server(idle[0], 5)
            assert guard.open <= 4
        finally:
            for conn in idle:
                conn.close()


def test_a_frozen_replica_is_avoided_while_another_answers(fast_replicas: ServerProcess) -> None:
    """Bug 10 with replicas: new requests go to the replica that answers, not the frozen one.
    On the session's replicated fast server (tests/serving/conftest.py): the replica is
    resumed and answering again before the test ends."""
    server = fast_replicas
    with httpx.Client(timeout=20) as client:
        pid = client.get(server.url + "/health").json()["processes"]["heads#0"]
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: client.get(server.url + "/health").json().get("unresponsive") == ["heads#0"], timeout=20)
            time.sleep(1.5)  # the liveness check has run since (once a second)
            for _ in range(6):  # least-loaded placement alternates: half would go to heads#0
                started = time.monotonic()
                answer = client.post(server.url + "/v1/chat/completions", json=CHAT, timeout=10)
                assert answer.status_code == 200, answer.text
                assert time.monotonic() - started < 5
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: client.get(server.url + "/health").json()["status"] == "ok", timeout=20)


def test_accept_errors_are_logged_once_not_in_a_loop(caplog: pytest.LogCaptureFixture) -> None:
    """Bug 6: out of file descriptors, asyncio logged `socket.accept() out of system resource`
    with a traceback on every retry (256-508 MB of log)."""
    from omnictl.serving.common.connections import ConnectionGuard

    loop = asyncio.new_event_loop()
    try:
        previous = ConnectionGuard(10, 1.0).accept_errors(loop)
        handler = loop.get_exception_handler()
        assert handler is not None
        with caplog.at_level("WARNING"):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")})
        lines = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None
        loop.set_exception_handler(previous)
    finally:
        loop.close()
