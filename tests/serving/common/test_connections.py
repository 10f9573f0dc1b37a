"""The connection guard below the ASGI app (omnictl.serving.common.connections): the header
timeout (from opening, and again after each response), the cap on open connections (the
oldest idle one evicted, or the new one refused), WebSocket sessions counted once, the app's
``omnictl.hangup`` of a WebSocket, the once-a-minute warnings, asyncio's accept errors, and
:func:`connection_cap` under the open-files limit.

A real uvicorn server with the guard's protocol classes, in this process and this test's
event loop, serving a small ASGI app of its own on 127.0.0.1; real client sockets (asyncio
streams, hand-made WebSocket frames, and the ``websockets`` client). Each test well under a
second."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import resource
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from omnictl.serving.common import connections
from omnictl.serving.common.connections import RESERVED_FDS, ConnectionGuard, connection_cap
from tests.support.wait import eventually, run

HEADER_TIMEOUT_S = 0.2
GET = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
EVICTING = (
    "at the limit of %d open connections: closing idle ones to let new clients in "
    "(--max-connections; logged once a minute)"
)
REFUSING = (
    "at the limit of %d open connections with none idle: refusing new ones (--max-connections; logged once a minute)"
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
WebSocketRoute = Callable[[Scope, Receive, Send], Awaitable[None]]


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "omnictl.serving" and r.levelno == logging.WARNING]


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


# --- the app and the server ------------------------------------------------------------------


@dataclass
class App:
    """``/`` answers ok; ``/wait`` answers once ``release`` is set; ``/echo`` answers its body;
    a WebSocket goes to ``websocket`` (by default: echo text until the client leaves)."""

    websocket: WebSocketRoute | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0
    scopes: list[Scope] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        if scope["type"] == "websocket":
            await (self.websocket or echo_websocket)(scope, receive, send)
            return
        assert scope["type"] == "http"
        body = b"ok"
        if scope["path"] == "/wait":
            self.waiting += 1
            await self.release.wait()
            body = b"released"
        elif scope["path"] == "/echo":
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def echo_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": message["text"]})


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test process keeps its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(guard: ConnectionGuard, app: App) -> AsyncIterator[tuple[str, int]]:
    """A uvicorn server with the guard's protocols, built as ``omnictl serve`` builds it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        http=guard.http_protocol(),
        ws=guard.websocket_protocol(),
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=2,
    )
    server = QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or task.done())
        if task.done():
            task.result()
        host, port = sock.getsockname()[:2]
        yield host, port
    finally:
        app.release.set()
        server.should_exit = True
        await task
        sock.close()


class Client:
    """One raw TCP connection to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: tuple[str, int]) -> Client:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, bytes]:
        """The next response: its status and body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 3)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in header_lines if line)
        body = await asyncio.wait_for(self.reader.readexactly(int(headers["content-length"])), 3)
        return int(status_line.split(" ")[1]), body

    async def closed_within(self, seconds: float) -> bytes:
        """Whatever the server still sends before it closes the connection (fails if it does not)."""
        data = b""

        async def read_to_the_end() -> None:
            nonlocal data
            with contextlib.suppress(ConnectionResetError):
                while chunk := await self.reader.read(65536):
                    data += chunk

        await asyncio.wait_for(read_to_the_end(), seconds)
        return data

    async def stays_open(self, seconds: float) -> None:
        """The server neither sends anything nor closes the connection for ``seconds``."""
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(self.reader.read(1), seconds)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[Callable[[tuple[str, int]], Awaitable[Client]]]:
    """Open clients with the function yielded; all are closed on the way out."""
    opened: list[Client] = []

    async def open_one(address: tuple[str, int]) -> Client:
        client = await Client.open(address)
        opened.append(client)
        return client

    try:
        yield open_one
    finally:
        for client in opened:
            await client.close()


# --- hand-made WebSocket frames (for a client that does not answer a close) ---------------------


async def websocket_handshake(client: Client, path: str = "/ws") -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    await client.send(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 3)
    assert head.startswith(b"HTTP/1.1 101 "), head


async def read_frame(client: Client) -> tuple[int, bytes]:
    """A frame from the server (unmasked, short): its first byte (FIN and opcode) and payload."""
    first, second = await asyncio.wait_for(client.reader.readexactly(2), 3)
    assert second < 126, second  # no mask bit, a short payload
    return first, await client.reader.readexactly(second)


def client_frame(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_payload(code: int, reason: str) -> bytes:
    return struct.pack("!H", code) + reason.encode()


def ws_client(address: tuple[str, int], path: str = "/ws") -> connect:
    return connect(f"ws://{address[0]}:{address[1]}{path}", proxy=None, compression=None, open_timeout=3)


async def echoes(ws: ClientConnection, text: str) -> bool:
    await ws.send(text)
    return await asyncio.wait_for(ws.recv(), 3) == text


# --- the header timeout ------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_or_half_its_headers_is_closed_after_the_header_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=HEADER_TIMEOUT_S)
        async with serving(guard, App()) as address, clients() as open_client:
            opened = time.monotonic()
            silent = await open_client(address)
            partial = await open_client(address)
            leaving = await open_client(address)
            await partial.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            await eventually(lambda: guard.open == 3)
            assert len(guard.idle) == 3
            await leaving.close()  # a client that leaves by itself is not a timeout
            await eventually(lambda: guard.open == 2)
            assert len(guard.idle) == 2
            await silent.stays_open(0.1)
            assert await silent.closed_within(3) == b""  # closed, without an answer
            assert await partial.closed_within(3) == b""
            assert HEADER_TIMEOUT_S <= time.monotonic() - opened < HEADER_TIMEOUT_S * 1.75
            await eventually(lambda: guard.open == 0)
            assert (guard.timed_out, guard.refused, guard.evicted, len(guard.idle)) == (2, 0, 0, 0)
            served = await open_client(address)  # the server itself is fine
            await served.send(GET)
            assert await served.response() == (200, b"ok")
        assert warnings_logged(caplog) == [] and errors_logged(caplog) == []

    run(scenario())


def test_headers_finished_in_time_are_served_and_a_slow_body_is_not_cut() -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=HEADER_TIMEOUT_S)
        async with serving(guard, App()) as address, clients() as open_client:
            client = await open_client(address)
            await asyncio.sleep(HEADER_TIMEOUT_S / 2)
            await client.send(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n")
            await eventually(lambda: len(guard.idle) == 0)  # a request in progress: not idle
            await client.stays_open(HEADER_TIMEOUT_S * 1.25)  # the body may take its time (--body-timeout bounds it)
            assert (guard.open, guard.timed_out) == (1, 0)
            await client.send(b"hello")
            assert await client.response() == (200, b"hello")
            assert (guard.open, guard.timed_out, len(guard.idle)) == (1, 0, 1)  # kept alive: idle again

    run(scenario())


def test_after_each_response_the_next_request_has_the_header_timeout_again() -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=HEADER_TIMEOUT_S)
        async with serving(guard, App()) as address, clients() as open_client:
            kept = await open_client(address)
            half = await open_client(address)  # its next request's headers begun, never finished
            await half.send(GET)
            assert await half.response() == (200, b"ok")
            await half.send(b"GET / HTTP/1.1\r\nHost: 12")
            for _ in range(3):  # 4 requests, each within the timeout of the last response: 0.3 s in all
                await kept.send(GET)
                assert await kept.response() == (200, b"ok")
                await asyncio.sleep(HEADER_TIMEOUT_S / 2)
            assert await half.closed_within(3) == b""
            assert (guard.timed_out, len(guard.idle)) == (1, 1)
            await kept.send(GET)
            assert await kept.response() == (200, b"ok")
            answered = time.monotonic()
            assert (len(guard.idle), guard.open) == (1, 1)
            assert await kept.closed_within(3) == b""  # then idle past the timeout: closed
            assert time.monotonic() - answered >= HEADER_TIMEOUT_S * 0.75
            await eventually(lambda: guard.open == 0)
            assert (guard.timed_out, guard.refused, guard.evicted, len(guard.idle)) == (2, 0, 0, 0)

    run(scenario())


# --- the cap ------------------------------------------------------------------------------------


def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=3, header_timeout_s=5.0)
        async with serving(guard, App()) as address, clients() as open_client:
            first = await open_client(address)
            await eventually(lambda: guard.open == 1)
            second = await open_client(address)
            await eventually(lambda: guard.open == 2)
            third = await open_client(address)
            await eventually(lambda: guard.open == 3)
            await first.send(GET)  # served: idle again, now the newest idle one
            assert await first.response() == (200, b"ok")
            assert warnings_logged(caplog) == []

            fourth = await open_client(address)
            assert await second.closed_within(3) == b""
            await eventually(lambda: guard.open == 3)
            assert (guard.evicted, guard.refused, guard.timed_out) == (1, 0, 0)
            await fourth.send(GET)
            assert await fourth.response() == (200, b"ok")
            await third.stays_open(0.05)
            await first.send(GET)
            assert await first.response() == (200, b"ok")

            await open_client(address)  # idle now, oldest first: third, fourth, first
            assert await third.closed_within(3) == b""
            await eventually(lambda: guard.open == 3)
            assert (guard.evicted, guard.refused) == (2, 0)
            await fourth.send(GET)
            assert await fourth.response() == (200, b"ok")
            assert warnings_logged(caplog) == [EVICTING % 3]  # once a minute, however many

    run(scenario())


def test_at_the_cap_with_none_idle_a_new_connection_is_refused_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        app = App()
        guard = ConnectionGuard(max_connections=2, header_timeout_s=5.0)
        async with serving(guard, app) as address, clients() as open_client:
            busy = []
            for count in (1, 2):
                client = await open_client(address)
                await client.send(b"GET /wait HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                await eventually(lambda: app.waiting == count)  # noqa: B023  # awaited here, in this iteration
                busy.append(client)
            assert (guard.open, len(guard.idle)) == (2, 0)

            started = time.monotonic()
            refused = await open_client(address)
            assert await refused.closed_within(3) == b""
            assert time.monotonic() - started < 1.0
            assert (guard.open, guard.refused, guard.evicted, guard.timed_out) == (2, 1, 0, 0)
            again = await open_client(address)
            assert await again.closed_within(3) == b""
            assert (guard.open, guard.refused) == (2, 2)
            assert warnings_logged(caplog) == [REFUSING % 2]  # two refusals, one line

            app.release.set()
            for client in busy:
                assert await client.response() == (200, b"released")
            assert len(guard.idle) == 2
            await open_client(address)  # idle ones again: the first answered makes room
            assert await busy[0].closed_within(3) == b""
            await busy[1].stays_open(0.05)
            await eventually(lambda: guard.open == 2)
            assert (guard.refused, guard.evicted) == (2, 1)
            assert warnings_logged(caplog) == [REFUSING % 2, EVICTING % 2]  # each kind its own line
        assert errors_logged(caplog) == []

    run(scenario())


def test_make_room_passes_over_idle_connections_that_are_already_closing(caplog: pytest.LogCaptureFixture) -> None:
    @dataclass(eq=False)
    class Idle:
        closes: bool
        asked: int = 0

        def close_idle(self) -> bool:
            self.asked += 1
            return self.closes

    guard = ConnectionGuard(max_connections=2, header_timeout_s=1.0, open=1)
    spare = Idle(closes=True)
    guard.idle[spare] = None
    assert guard.make_room() and spare.asked == 0  # under the cap: nothing closed
    guard.open = 3  # over the cap, as while an evicted connection is still closing: the message names the cap
    closing, live, newer = Idle(closes=False), Idle(closes=True), Idle(closes=True)
    guard.idle.clear()
    for idle in (closing, live, newer):
        guard.idle[idle] = None
    assert guard.make_room()
    assert (closing.asked, live.asked, newer.asked, guard.evicted) == (1, 1, 0, 1)
    assert list(guard.idle) == [newer]
    assert warnings_logged(caplog) == [EVICTING % 2]

    stale = ConnectionGuard(max_connections=2, header_timeout_s=1.0, open=2)
    gone = [Idle(closes=False), Idle(closes=False)]
    for idle in gone:
        stale.idle[idle] = None
    assert not stale.make_room()
    assert [idle.asked for idle in gone] == [1, 1] and stale.evicted == 0 and not stale.idle
    assert not ConnectionGuard(max_connections=2, header_timeout_s=1.0, open=3).make_room()
    assert warnings_logged(caplog) == [EVICTING % 2]  # nothing evicted: nothing said


class StubTransport:
    """Just what the guarded protocol asks of its transport, to put it in states a socket passes through."""

    def __init__(self) -> None:
        self.closing = False
        self.protocol: object = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_protocol(self) -> object:
        return self.protocol

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def stub_cycle(complete: bool) -> SimpleNamespace:
    """A request/response cycle, as far as the guard and connection_lost look at one."""
    return SimpleNamespace(response_complete=complete, message_event=asyncio.Event(), disconnected=False)


def test_an_idle_connection_is_closed_only_if_still_open_still_http_and_between_requests() -> None:
    loop = asyncio.new_event_loop()
    try:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=60.0)
        config = uvicorn.Config(App(), log_config=None, lifespan="off")
        config.load()
        protocol_class = guard.http_protocol()

        def connection() -> tuple[Any, StubTransport]:
            transport = StubTransport()
            protocol = protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)  # type: ignore[arg-type]
            return protocol, transport

        closing, closing_transport = connection()
        upgraded, upgraded_transport = connection()
        busy, busy_transport = connection()
        between, between_transport = connection()
        assert (guard.open, list(guard.idle)) == (4, [closing, upgraded, busy, between])
        closing_transport.closing = True
        upgraded_transport.protocol = object()  # the WebSocket protocol has the socket now
        busy.cycle = stub_cycle(complete=False)
        between.cycle = stub_cycle(complete=True)
        assert [p.close_idle() for p in (closing, upgraded, busy, between)] == [False, False, False, True]
        assert [t.closing for t in (upgraded_transport, busy_transport, between_transport)] == [False, False, True]
        assert not guard.idle  # each left the idle ones either way
        between_transport.closing = False  # kept alive after all
        for protocol in (closing, upgraded, busy, between):  # a response completes on each
            protocol.on_response_complete()
        assert list(guard.idle) == [between]  # only it waits for a next request

        late, late_transport = connection()
        late.cycle = stub_cycle(complete=True)  # a request came and went since the timer was set
        late._headers_late()
        assert (late_transport.closing, guard.timed_out) == (False, 0)
        timed, timed_transport = connection()
        timed._headers_late()
        assert (timed_transport.closing, guard.timed_out) == (True, 1)
        for protocol in (closing, upgraded, busy, between, late, timed):
            protocol.connection_lost(None)
        assert (guard.open, len(guard.idle)) == (0, 0)
    finally:
        loop.close()


# --- WebSocket sessions --------------------------------------------------------------------------


def test_a_websocket_counts_once_and_is_released_when_it_closes(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=HEADER_TIMEOUT_S)
        async with serving(guard, App()) as address:
            async with ws_client(address) as ws:
                assert await echoes(ws, "one")
                assert (guard.open, len(guard.idle)) == (1, 0)
                async with ws_client(address) as other:
                    assert await echoes(other, "two")
                    assert guard.open == 2
                await eventually(lambda: guard.open == 1)
                await asyncio.sleep(HEADER_TIMEOUT_S * 1.5)  # no header timeout once upgraded
                assert await echoes(ws, "still here")
                assert (guard.open, guard.timed_out, len(guard.idle)) == (1, 0, 0)
            await eventually(lambda: guard.open == 0)
            assert (guard.refused, guard.evicted, guard.timed_out) == (0, 0, 0)
        assert errors_logged(caplog) == []

    run(scenario())


def test_at_the_cap_a_websocket_session_is_not_idle_so_a_new_connection_is_refused() -> None:
    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=1, header_timeout_s=5.0)
        async with serving(guard, App()) as address, clients() as open_client:
            async with ws_client(address) as ws:
                assert await echoes(ws, "hi")
                refused = await open_client(address)
                assert await refused.closed_within(3) == b""
                assert (guard.open, guard.refused, guard.evicted) == (1, 1, 0)
                assert await echoes(ws, "still here")
            await eventually(lambda: guard.open == 0)

    run(scenario())


def test_a_websocket_handshake_the_protocol_refuses_is_answered_and_released(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        app = App()
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, app) as address, clients() as open_client:
            client = await open_client(address)
            await client.send(
                b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            )
            answer = await client.closed_within(3)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
            await eventually(lambda: guard.open == 0)
            assert app.scopes == []  # no key, no version: the app never sees it
        assert errors_logged(caplog) == []

    run(scenario())


# --- the app hangs up a WebSocket ---------------------------------------------------------------


def test_the_app_hangs_up_a_websocket_with_its_code_and_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connections, "HANGUP_GRACE_S", 30.0)  # the client's answer closes it, not the grace
    seen: list[dict[str, Any]] = []

    async def hang_up_on_bye(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        assert (await receive())["text"] == "bye"
        scope["extensions"]["omnictl.hangup"](4001, "go away now")
        seen.append(await receive())

    async def scenario() -> None:
        app = App(websocket=hang_up_on_bye)
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, app) as address:
            async with ws_client(address) as ws:
                assert guard.open == 1
                await ws.send("bye")
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 3)
                assert closed.value.rcvd is not None
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "go away now")
                started = time.monotonic()
                await asyncio.wait_for(ws.wait_closed(), 3)
                assert time.monotonic() - started < 2.0
            await eventually(lambda: guard.open == 0)
            assert seen == [{"type": "websocket.disconnect", "code": 4001, "reason": "go away now"}]
            (scope,) = app.scopes
            assert sorted(scope["extensions"]) == ["omnictl.hangup", "websocket.http.response"]
        assert errors_logged(caplog) == []

    run(scenario())


def test_a_client_that_never_answers_the_hang_up_is_cut_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connections, "HANGUP_GRACE_S", 0.2)
    outcome: list[str] = []

    async def hang_up_twice(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        scope["extensions"]["omnictl.hangup"](4002, "gone")
        scope["extensions"]["omnictl.hangup"](4003, "again")  # one close frame only
        outcome.append("returned")

    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, App(websocket=hang_up_twice)) as address, clients() as open_client:
            client = await open_client(address)
            await websocket_handshake(client)
            assert await read_frame(client) == (0x88, close_payload(4002, "gone"))
            received = time.monotonic()
            await client.send(client_frame(0x1, b"ignored: the server is closing"))  # read, and dropped
            await client.stays_open(0.1)
            assert guard.open == 1
            assert await client.closed_within(3) == b""  # no second close frame, no data
            assert time.monotonic() - received >= 0.15
            await eventually(lambda: guard.open == 0)
            assert outcome == ["returned"]
        assert errors_logged(caplog) == []

    run(scenario())


def test_a_second_hang_up_neither_puts_off_the_cut_nor_tells_the_app_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "HANGUP_GRACE_S", 0.4)
    told: list[Any] = []

    async def hang_up_then_again(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        scope["extensions"]["omnictl.hangup"](4002, "gone")
        await asyncio.sleep(0.3)
        scope["extensions"]["omnictl.hangup"](4003, "again")  # would restart a 0.4 s grace
        told.append(await receive())
        told.append(await asyncio.wait_for(receive(), 2))

    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, App(websocket=hang_up_then_again)) as address, clients() as open_client:
            client = await open_client(address)
            await websocket_handshake(client)
            assert await read_frame(client) == (0x88, close_payload(4002, "gone"))
            received = time.monotonic()
            assert await client.closed_within(3) == b""
            assert time.monotonic() - received < 0.6  # cut by the first grace (0.4 s), not 0.3 + 0.4 s
            await eventually(lambda: guard.open == 0)
        assert [m["type"] for m in told[:1]] == ["websocket.disconnect"] and told[0]["code"] == 4002

    run(scenario())


def test_a_hang_up_reads_the_answer_even_when_an_unread_message_had_paused_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "HANGUP_GRACE_S", 5.0)
    go = asyncio.Event()

    async def hang_up_unread(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await go.wait()  # the client's message waits, unread: uvicorn stopped reading the socket
        scope["extensions"]["omnictl.hangup"](4004, "unread")

    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, App(websocket=hang_up_unread)) as address, clients() as open_client:
            client = await open_client(address)
            await websocket_handshake(client)
            await client.send(client_frame(0x1, b"never read"))
            await asyncio.sleep(0.05)
            go.set()
            assert await read_frame(client) == (0x88, close_payload(4004, "unread"))
            started = time.monotonic()
            await client.send(client_frame(0x8, close_payload(4004, "unread")))
            assert await client.closed_within(3) == b""
            assert time.monotonic() - started < 2.0  # the answer was read: no waiting out the grace
            await eventually(lambda: guard.open == 0)

    run(scenario())


def test_a_hang_up_after_the_client_left_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    outcome: list[str] = []

    async def hang_up_late(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.disconnect"
        scope["extensions"]["omnictl.hangup"](4005, "too late")
        outcome.append("returned")

    async def scenario() -> None:
        guard = ConnectionGuard(max_connections=8, header_timeout_s=5.0)
        async with serving(guard, App(websocket=hang_up_late)) as address:
            async with ws_client(address) as ws:
                await ws.close(1000, "done")
                assert ws.close_code == 1000
            await eventually(lambda: outcome == ["returned"] and guard.open == 0)
        assert errors_logged(caplog) == []

    run(scenario())


# --- the warnings -------------------------------------------------------------------------------


def test_say_logs_each_kind_once_a_minute(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    monkeypatch.setattr(connections, "time", SimpleNamespace(monotonic=lambda: now[0]))
    guard = ConnectionGuard(max_connections=4, header_timeout_s=1.0)
    guard.say("refused", "refusing at %d", 4)  # the first is said at once, whatever the clock reads
    guard.say("refused", "refusing at %d", 5)
    guard.say("evicted", "evicting at %d", 4)  # another kind: its own minute
    now[0] = 59.9
    guard.say("refused", "refusing at %d", 6)
    now[0] = 60.0
    guard.say("refused", "refusing at %d", 7)
    guard.say("evicted", "evicting at %d", 5)
    now[0] = 119.0
    guard.say("refused", "refusing at %d", 8)
    guard.say("evicted", "evicting at %d", 6)
    assert warnings_logged(caplog) == [
        "refusing at 4",
        "evicting at 4",
        "refusing at 7",
        "evicting at 5",
    ]
    assert all(r.exc_info is None for r in caplog.records)


# --- asyncio's accept errors ---------------------------------------------------------------------


OUT_OF_FILES = {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")}


def test_accept_errors_are_one_warning_a_minute_and_other_errors_go_to_the_default_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        guard = ConnectionGuard(max_connections=10, header_timeout_s=1.0, open=7)
        assert guard.accept_errors(loop) is None
        handler = loop.get_exception_handler()
        assert handler is not None
        for _ in range(50):
            handler(loop, dict(OUT_OF_FILES))
        handler(loop, {**OUT_OF_FILES, "message": "socket.accept() out of system resource: more"})
        assert warnings_logged(caplog) == [
            "cannot accept connections: [Errno 24] Too many open files (open: 7; lower --max-connections or "
            "raise the open-files limit; logged once a minute)"
        ]
        assert all(r.exc_info is None for r in caplog.records)
        handler(loop, {"message": "Unclosed thing: socket.accept() out of system resource"})
        handler(loop, {"exception": ValueError("no message")})
        assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records[1:]] == [
            ("asyncio", "ERROR", "Unclosed thing: socket.accept() out of system resource"),
            ("asyncio", "ERROR", "Unhandled exception in event loop"),
        ]
    finally:
        loop.close()


def test_accept_errors_hands_other_errors_to_the_handler_it_replaced(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        passed: list[dict[str, Any]] = []

        def previous(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            passed.append(context)

        loop.set_exception_handler(previous)
        guard = ConnectionGuard(max_connections=10, header_timeout_s=1.0)
        assert guard.accept_errors(loop) is previous
        handler = loop.get_exception_handler()
        assert handler is not None and handler is not previous
        other = {"message": "Task exception was never retrieved", "exception": RuntimeError("boom")}
        handler(loop, dict(OUT_OF_FILES))
        handler(loop, other)
        assert passed == [other]  # the accept error is not passed on
        assert warnings_logged(caplog) == [
            "cannot accept connections: [Errno 24] Too many open files (open: 0; lower --max-connections or "
            "raise the open-files limit; logged once a minute)"
        ]
        assert errors_logged(caplog) == []  # the default handler was not called
    finally:
        loop.close()


# --- the cap under the open-files limit ----------------------------------------------------------


@pytest.mark.parametrize(
    ("soft", "requested", "cap"),
    [
        (1024, None, 1024 - RESERVED_FDS),
        (1024, 500, 500),
        (1024, 768, 768),
        (1024, 769, 768),
        (1024, 100_000, 768),
        (1024, 1, 1),
        (1024, 0, 1),
        (1024, -5, 1),
        (273, None, 17),
        (272, None, 16),
        (100, None, 16),  # a tiny limit still leaves 16
        (100, 20, 16),
        (100, 10, 10),
        (resource.RLIM_INFINITY, None, 65_536),
        (resource.RLIM_INFINITY, 100_000, 65_536),
        (resource.RLIM_INFINITY, 70, 70),
    ],
)
def test_connection_cap_stays_below_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, requested: int | None, cap: int
) -> None:
    asked: list[int] = []

    def getrlimit(which: int) -> tuple[int, int]:
        asked.append(which)
        return soft, 4096

    monkeypatch.setattr(connections.resource, "getrlimit", getrlimit)
    assert RESERVED_FDS == 256
    assert connection_cap(requested) == cap
    assert asked == [resource.RLIMIT_NOFILE]
