"""No single client denies service (issue 24): what one realtime client sends is bounded,
answered, and never stalls the server for the others. Against the fast topology's server
(real `omnictl serve`, real sockets, Silero server VAD, loopback only)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import statistics
import threading
import time
from typing import Any, Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.serving.harness import API_KEY, ServerProcess, wait_until

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?model=fast"


@pytest.fixture()
def ws(server: ServerProcess) -> Iterator[Any]:
    with connect(_ws_url(server), additional_headers=AUTH, max_size=None) as socket_:
        assert json.loads(socket_.recv(timeout=30))["type"] == "session.created"
        yield socket_


def _next(ws: Any, *kinds: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if event["type"] in kinds:
            return event


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _still_served(ws: Any) -> None:
    ws.send(json.dumps({"type": "session.update", "event_id": "alive", "session": {"type": "realtime"}}))
    assert _next(ws, "session.updated")["type"] == "session.updated"


def test_an_audio_flood_with_server_vad_does_not_stall_health(server: ServerProcess, ws: Any) -> None:
    """Bug 1: 100 appends of 16 s of silence (server VAD on, the default) once held /health for 41 s."""
    silence = base64.b64encode(bytes(16 * 24_000 * 2)).decode()
    message = json.dumps({"type": "input_audio_buffer.append", "audio": silence})
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                started = time.perf_counter()
                assert client.get(server.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(100):
            ws.send(message)
        _still_served(ws)  # every append was handled (or refused) before this answer
    finally:
        done.set()
        prober.join()
    assert len(latencies) >= 5, latencies
    # The target is 100 ms (it was 41 s, and a timeout). The median holds it; a single probe
    # may still wait for a core on a loaded 2-core machine, hence the looser bound on the max.
    assert statistics.median(latencies) < 0.1 and max(latencies) < 2.5, sorted(latencies)[-5:]


def test_audio_faster_than_the_bound_is_refused_with_an_error(ws: Any) -> None:
    ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                               "audio": {"input": {"turn_detection": None}}}}))
    _next(ws, "session.updated")
    chunk = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(16 * 24_000 * 2)).decode()})
    codes = []
    for i in range(20):  # 320 s of audio at once, committed every 96 s: past the 240 s burst
        ws.send(chunk)
        if i % 6 == 5:
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] != "input_audio_buffer.cleared":
        if event["type"] == "error":
            codes.append(event["error"]["code"])
    assert "input_audio_rate_exceeded" in codes, codes


def _raw_websocket(server: ServerProcess) -> socket.socket:
    """A WebSocket handshake on a plain socket that will never read what the server sends."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall((f"GET /v1/realtime?model=fast HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {API_KEY}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _frame(text: str) -> bytes:
    payload = text.encode()
    header = bytearray([0x81])
    n = len(payload)
    if n < 126:
        header.append(0x80 | n)
    elif n < 2**16:
        header += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return bytes(header) + b"\0\0\0\0" + payload  # mask 0: the payload goes as it is


def _close_code(data: bytes) -> int | None:
    """The code of the close frame among the server's (unmasked) frames in ``data``."""
    at = 0
    while at + 2 <= len(data):
        opcode, n = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if n == 126:
            n, at = int.from_bytes(data[at:at + 2], "big"), at + 2
        elif n == 127:
            n, at = int.from_bytes(data[at:at + 8], "big"), at + 8
        if opcode == 0x8:
            return int.from_bytes(data[at:at + 2], "big")
        at += n
    return None


def test_a_client_that_never_reads_is_disconnected_and_memory_stays_bounded(server: ServerProcess) -> None:
    """Bug 2: a 1 MB conversation.item.create echoed twice per event, never read: 68 -> 1,598 MB in 2 s."""
    before = _rss_mb(server.process.pid)
    text = "x" * (1000 * 1000)
    event = _frame(json.dumps({"type": "conversation.item.create",
                               "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    sock = _raw_websocket(server)
    sock.settimeout(20)
    peak = [before]
    stop = threading.Event()

    def flood() -> None:  # never reads
        try:
            for _ in range(300):
                if stop.is_set():
                    return
                sock.sendall(event)
                peak[0] = max(peak[0], _rss_mb(server.process.pid))
                if peak[0] - before > 200:
                    return  # failed already: no need to fill the machine's memory
        except OSError:
            return  # the server hung up

    sender = threading.Thread(target=flood)
    sender.start()
    try:
        wait_until(lambda: "not reading its events" in server.text() or not sender.is_alive(), timeout=60)
        assert "not reading its events" in server.text(), f"the server never gave up (RSS +{peak[0] - before:.0f} MB)"
        received = bytearray()  # now read: what was queued, then the close frame
        with contextlib.suppress(OSError):
            while (chunk := sock.recv(1 << 20)) and _close_code(bytes(received := received + chunk)) is None:
                pass
    finally:
        stop.set()
        sock.close()
        sender.join(30)
    assert peak[0] - before < 50, f"server RSS grew {peak[0] - before:.0f} MB (from {before:.0f} MB)"
    assert _close_code(bytes(received)) == 1008, f"no close frame 1008 in the {len(received)} bytes received"
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_megabyte_bad_event_is_answered_and_logged_in_a_few_hundred_bytes(server: ServerProcess, ws: Any) -> None:
    """Bug 3: every bad event was logged with the client's data: 105 KB sent, 105 MB of log."""
    huge = "x" * (1024 * 1024 - 100)
    log_before = len(server.text())
    for i in range(20):
        ws.send(json.dumps({"type": huge if i % 2 else "nope", "event_id": f"evt{i}"}))
        error = _next(ws, "error")
        assert error["error"]["code"] == "invalid_event_type"
        assert len(json.dumps(error)) < 2000
    _still_served(ws)
    time.sleep(0.5)  # the log pump reads the server's output in a thread
    assert len(server.text()) - log_before < 10_000, server.text()[log_before:][-3000:]


@pytest.mark.parametrize("message, code", [
    ("[" * 100_000 + "]" * 100_000, "invalid_json"),  # deeper than the recursion limit
    ('{"type": "session.update", "event_id": "\\ud800"}', "invalid_value"),
    ('{"type": "session.update", "session": {"type": "realtime", "instructions": "\\udfff"}}', "invalid_value"),
    ('{"type": "conversation.item.create", "item": {"content": [{"type": "input_text", "text": "\\ud83d"}]}}', "invalid_value"),
])
def test_events_that_killed_the_session_are_errors_and_it_goes_on(server: ServerProcess, ws: Any, message: str,
                                                                  code: str) -> None:
    """Bug 7: RecursionError / lone surrogates dropped the socket with a traceback."""
    ws.send(message)
    assert _next(ws, "error")["error"]["code"] == code
    _still_served(ws)
    assert "Exception in ASGI application" not in server.text()


@pytest.mark.parametrize("response", [{"max_output_tokens": 2**63}, {"instructions": "\ud800"}])
def test_a_response_either_is_refused_or_ends_with_response_done(ws: Any, response: dict[str, Any]) -> None:
    """Bug 8: response.created and then nothing, "Task exception was never retrieved"."""
    message = json.dumps({"type": "response.create", "event_id": "r1", "response": response})
    ws.send(message)
    first = _next(ws, "error", "response.created")
    if first["type"] == "response.created":
        assert _next(ws, "response.done")["response"]["id"] == first["response"]["id"]
    else:
        assert first["error"]["event_id"] == "r1"
    ws.send(json.dumps({"type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
    ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    assert _next(ws, "response.done")["response"]["status"] == "completed"


def test_sessions_beyond_the_limit_are_refused_with_the_protocols_error(server: ServerProcess) -> None:
    with contextlib.ExitStack() as opened:
        for _ in range(16):  # the default --max-realtime-sessions
            session = opened.enter_context(connect(_ws_url(server), additional_headers=AUTH))
            assert json.loads(session.recv(timeout=30))["type"] == "session.created"
        with connect(_ws_url(server), additional_headers=AUTH) as extra:
            event = json.loads(extra.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["code"] == "session_limit_reached"
            with pytest.raises(ConnectionClosed) as closed:
                extra.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    # once they are closed, a new session is served again
    wait_until(lambda: _session_opens(server), timeout=15)


def _session_opens(server: ServerProcess) -> bool:
    with connect(_ws_url(server), additional_headers=AUTH) as ws_:
        return json.loads(ws_.recv(timeout=30))["type"] == "session.created"


def test_64_commits_of_120_s_keep_the_server_small(server: ServerProcess, ws: Any) -> None:
    """Bug 5: 64 commits of 120 s of silence pinned 1.1 GB (each kept as float32). The audio
    rate bound refuses most of it; what is kept is bounded by the conversation's token budget
    (and the session's memory bound)."""
    ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                               "audio": {"input": {"turn_detection": None}}}}))
    _next(ws, "session.updated")
    before = _rss_mb(server.process.pid)
    fifteen_s = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(15 * 24_000 * 2)).decode()})
    codes: list[str] = []
    for i in range(64):
        for _ in range(8):
            ws.send(fifteen_s)
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"c{i}"}))
        while (event := _next(ws, "input_audio_buffer.committed", "error"))["type"] == "error":
            codes.append(event["error"]["code"])
            if event["error"]["event_id"] == f"c{i}":
                break
    # conversation.item.create with audio (16 s an item) skips the rate bound: the token budget holds it
    item = json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(bytes(16 * 24_000 * 2)).decode()}]}})
    for _ in range(64):
        ws.send(item)
        _next(ws, "conversation.item.added", "error")
    growth = _rss_mb(server.process.pid) - before
    assert growth < 100, f"server RSS grew {growth:.0f} MB"
    assert "input_audio_rate_exceeded" in codes, codes
    _still_served(ws)


def test_a_foreign_origin_and_a_foreign_host_are_refused(server: ServerProcess) -> None:
    """Bug 9: any page could open ws://127.0.0.1:PORT/v1/realtime; a rebinding page reached every route."""
    with pytest.raises(InvalidStatus) as refused:
        connect(_ws_url(server), additional_headers={**AUTH, "Origin": "http://evil.example"})
    assert refused.value.response.status_code == 403
    own = server.url  # the server's own origin is fine (the playground)
    with connect(_ws_url(server), additional_headers={**AUTH, "Origin": own}) as ws_:
        assert json.loads(ws_.recv(timeout=30))["type"] == "session.created"
    files = {"file": ("a.wav", b"RIFF", "audio/wav")}
    post = httpx.post(server.url + "/v1/audio/transcriptions", files=files, headers={**AUTH, "Origin": "http://evil.example"})
    assert post.status_code == 403 and post.json()["error"]["code"] == "forbidden_origin"
    rebound = httpx.get(server.url + "/v1/models", headers={**AUTH, "Host": f"attacker.example:{server.url.rsplit(':', 1)[1]}"})
    assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "misdirected_request"
    assert httpx.get(server.url + "/v1/models", headers={**AUTH, "Host": "localhost"}).status_code == 200


def test_stage_errors_name_no_server_path(server: ServerProcess) -> None:
    """Bug 13: stage errors ended with '(at /.../stages.py:40)'."""
    body = {"model": "fast", "messages": [{"role": "user", "content": "please explode"}]}
    answer = httpx.post(server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    message = answer.json()["error"]["message"]
    assert "exploded on purpose" in message and "(at fast_stages.py:" in message, message
    assert "/" not in message.split("(at ")[-1], message


@pytest.mark.parametrize("content_type, body", [
    (b"multipart/form-data", b"--abc\r\n\r\n--abc--\r\n"),  # no boundary declared
    (b"multipart/form-data; boundary=abc", b"--abc\r\nX-Part: 1\r\n\r\ndata\r\n--abc--\r\n"),  # a part with no name
])
def test_a_broken_multipart_body_is_a_400_naming_the_body(content_type: bytes, body: bytes) -> None:
    """Bug 12: inside the app Starlette turns a broken multipart body into its own
    text/plain 400 (HTTPException); the endpoint must raise the error its JSON 400 is made of."""
    from starlette.requests import Request

    from omnictl.exceptions import InvalidRequest
    from omnictl.serving.chat.protocol import Limits
    from omnictl.serving.transcriptions.route import parse_audio_form

    scope = {"type": "http", "method": "POST", "path": "/v1/audio/transcriptions", "headers": [
        (b"content-type", content_type)], "app": object(), "query_string": b""}

    async def parse() -> None:
        await parse_audio_form(Request(scope), body, Limits(), "transcribe")

    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(parse())
    assert refused.value.field == "body" and "multipart" in str(refused.value)


def test_a_client_leaving_mid_body_logs_no_traceback(server: ServerProcess) -> None:
    """Bug 12: a client closing mid-body logged a Starlette ClientDisconnect traceback per connection."""
    host, port = server.url.removeprefix("http://").split(":")
    before = len(server.text())
    left = "the client disconnected before sending its whole request body"  # its one line (info)
    for count in range(1, 4):
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         + f"Authorization: Bearer {API_KEY}\r\nContent-Length: 1000\r\n\r\n".encode() + b'{"model"')
        # the server read the head and part of the body, then saw it go: logged where the
        # traceback was (a disconnect not seen, or not handled, never says it)
        wait_until(lambda count=count: server.text()[before:].count(left) == count, timeout=10)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    logged = server.text()[before:]
    assert "Traceback" not in logged and "ClientDisconnect" not in logged, logged[-3000:]


def test_the_message_limit_counts_bytes_not_characters(ws: Any) -> None:
    """Bug 14: 1 M x "€" (3 MB) passed the 1 MiB limit, which counted characters."""
    ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "€" * 400_000}},
                       ensure_ascii=False))  # 400,000 characters, 1.2 MB
    error = _next(ws, "error")["error"]
    assert error["code"] == "message_too_large" and "1200" in error["message"].replace(",", ""), error
    _still_served(ws)


def test_one_speech_request_of_short_sentences_leaves_other_clients_chat_served(voice_server: ServerProcess) -> None:
    """Bug 4: "Hi. " x 1024 on /v1/audio/speech put ~1,000 sentences in the TTS stage's queue;
    backpressure counted them as requests, and every new request, text-only chat that never
    reaches the TTS included, was refused with 429 for 16-47 s."""
    body = {"model": "voice-assistant", "input": "Hi. " * 1024, "voice": "alloy", "response_format": "pcm"}
    chat = {"model": "voice-assistant", "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}
    with httpx.Client(timeout=120, headers=AUTH) as client:
        with client.stream("POST", voice_server.url + "/v1/audio/speech", json=body) as speech:
            assert speech.status_code == 200
            audio = speech.iter_bytes()
            next(audio)  # the first sentence is spoken: the other ~1,000 wait in the queue
            # The queue's size is not read from /health here: in two full-suite CI runs the TTS
            # stage's stats read empty (queued 0, requests 0) while this request streamed, though
            # alone and in its module it shows ~1,000 queued. Open: see the closing note.
            for _ in range(3):
                answer = client.post(voice_server.url + "/v1/chat/completions", json=chat)
                assert answer.status_code == 200, answer.text
            assert next(audio)  # and the long speech request was still being spoken meanwhile
        # leaving the stream aborts the speech request
