"""``POST /v1/realtime/calls`` in the test process: the app (``create_app``) called over ASGI in
this event loop, against a scripted pipeline, and a real aiortc client on loopback
(``tests/serving/realtime/rtc.py``). What a caller sees: the SDP answer and its ``Location``,
the form's ``session`` applied before ``session.created``, refusals naming what is wrong,
events on the ``oai-events`` data channel, the answer's audio paced on the server's track
(``output_audio_buffer.*``, never ``response.output_audio.delta``), cancel and barge-in clearing
it, every way a call ends (hangup, its data channel or peer connection closing, the connect
and idle timeouts, a client that does not read, the server stopping) with nothing left open,
the session limit shared with WebSockets, and which ICE host addresses are offered. The
server's outbound track (:class:`AnswerTrack`) and the event outbox are also driven directly."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import inspect
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

import aioice.ice
import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from omnictl.serving.app import create_app
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime import webrtc
from omnictl.serving.realtime.answer_track import FRAME_SAMPLES, AnswerTrack
from omnictl.serving.realtime.channel import Outbox
from omnictl.serving.realtime.ice import HOSTS_ENV, restrict_to
from omnictl.serving.state import ServingState
from tests.serving.common.test_request_checks import topology
from tests.serving.realtime.rtc import Call, Microphone, loopback_only
from tests.serving.realtime.speech import sample, silence
from tests.serving.scripted import CHAT_ONLY, EVERY_ENDPOINT, ScriptedPipeline, audio_events, text_events

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
RATE = 24_000  # the session's pcm16 rate, and the answer track's
NOTHING = {"sessions": 0, "websocket_sessions": 0, "webrtc_sessions": 0, "peer_connections": 0}
LOG = "omnictl.serving.realtime"
OVERSIZED = b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n" + b"a=x\r\n" * 13_200  # over 64 KiB
CANDIDATE = re.compile(r"a=candidate:\S+ \d \w+ \d+ (\S+) \d+ typ (\w+)")


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """ICE gathers on 127.0.0.1 only (the server's host filter, installed by each app, wraps this)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)  # restored after
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    loopback_only()


def run(scenario: Callable[[], Awaitable[None]], timeout: float = 15) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout))


async def until(check: Callable[[], Any], what: str, timeout: float = 5.0) -> None:
    """Poll ``check`` (a function, or a coroutine function) until it is true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


def ask(text: str = "hi", **response: Any) -> list[dict[str, Any]]:
    """A user text item, then a response to it."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [{"type": "conversation.item.create", "item": item}, {"type": "response.create", "response": response}]


def held_answer(seconds: float = 3.0) -> ScriptedPipeline:
    """A pipeline whose answers stream ``seconds`` of a tone at once, then run on until aborted."""
    return ScriptedPipeline(
        topology=CHAT_ONLY, script=lambda inputs, modalities: audio_events(1, seconds=seconds)[:1], hold=True
    )


def rms(frames: list[np.ndarray]) -> float:
    samples = np.concatenate(frames).astype(np.float32) / 32768.0
    return float(np.sqrt(np.mean(samples**2)))


def ended(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Each ``realtime call ... ended: <why>`` logged, as its why."""
    return [
        r.getMessage().split(" ended: ", 1)[1]
        for r in caplog.records
        if r.name == LOG and r.getMessage().startswith("realtime call rtc_") and " ended: " in r.getMessage()
    ]


async def offer(channel: bool = True, audio: bool = True) -> str:
    """An aiortc client's SDP offer (its peer connection closed again)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if audio:
        pc.addTrack(Microphone())
    if channel:
        pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


@dataclass
class Served:
    """The app and its state, its ASGI client, the server's table of calls, and the client peers opened."""

    state: ServingState
    pipeline: Any
    app: Any
    http: httpx.AsyncClient
    calls: webrtc.Calls
    peers: list[Any] = field(default_factory=list)

    async def health(self) -> dict[str, int]:
        realtime: dict[str, int] = (await self.http.get("/health", headers=AUTH)).json()["realtime"]
        return realtime

    async def post(
        self,
        body: str | bytes,
        content_type: str = "application/sdp",
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        return await self.http.post(
            "/v1/realtime/calls" + query,
            content=body,
            headers={"Content-Type": content_type, **(AUTH if headers is None else headers)},
        )

    async def form(self, query: str = "", **files: Any) -> httpx.Response:
        return await self.http.post("/v1/realtime/calls" + query, files=files, headers=AUTH)

    async def dial(
        self, query: str = "", key: str | None = KEY, call: Call | None = None
    ) -> tuple[Call, httpx.Response]:
        """``call`` (a new one if None) posts its offer, as :meth:`Call.dial` does, to this app over ASGI."""
        call = call or Call()
        self.peers.append(call)
        await call.pc.setLocalDescription(await call.pc.createOffer())
        answer = await self.post(
            call.pc.localDescription.sdp, query=query, headers={} if key is None else {"Authorization": f"Bearer {key}"}
        )
        if answer.status_code == 201:
            call.location = answer.headers["location"]
            await call.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        return call, answer

    async def connected(self, query: str = "") -> Call:
        """A call answered, its data channel open, its ``session.created`` come."""
        call, answer = await self.dial(query)
        assert answer.status_code == 201, answer.text
        await call.opened(5)
        await call.next_of("session.created", 5)
        return call

    def server_side(self, call: Call) -> webrtc.Call:
        return self.calls.open[call.location.rsplit("/", 1)[-1]]

    async def hangup(self, location: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(location + "/hangup", headers=AUTH if headers is None else headers)

    async def idle(self) -> None:
        """Nothing is left: no call, no session, no request in flight."""

        async def nothing() -> bool:
            return await self.health() == NOTHING and not self.state.active and not self.calls.open

        await until(nothing, "every call, session and request ended")


@contextlib.asynccontextmanager
async def served(pipeline: Any, base_url: str = "http://127.0.0.1", **state: Any) -> AsyncIterator[Served]:
    """The app on ``pipeline``; on leaving, the peers close and (when the test passed) nothing is left open."""
    before = asyncio.all_tasks()
    serving = ServingState(model_name="m", pipeline=pipeline, api_key=KEY, **state)
    app = create_app(serving)
    [close_all] = serving.on_stop
    calls = getattr(close_all, "__self__", None)  # the app's table of WebRTC calls
    assert isinstance(calls, webrtc.Calls)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=10) as http:
        server = Served(serving, pipeline, app, http, calls)
        try:
            yield server
            for peer in server.peers:
                await peer.close()
            if pipeline is not None:
                await server.idle()  # the clients hung up: the server holds nothing for them
        finally:
            for peer in server.peers:
                await peer.close()
            await stopping(serving)
    await _no_tasks_left(before)


async def stopping(state: ServingState, timeout: float = 5.0) -> None:
    """What the server runs as it stops (its calls end), bounded without cancelling it: a wait
    that swallowed the cancellation would hang the test instead of failing it."""
    for stop in state.on_stop:
        done, _ = await asyncio.wait({asyncio.ensure_future(stop())}, timeout=timeout)
        if not done:
            raise AssertionError(f"the server's on_stop {stop.__qualname__} did not return within {timeout} s")


async def _no_tasks_left(before: set[asyncio.Task[Any]]) -> None:
    """Every task started since ``before`` (the server's, aiortc's, the clients') has ended."""
    left = lambda: [t for t in asyncio.all_tasks() - before if not t.done()]
    try:
        await until(lambda: not left(), "every task ended")
    except AssertionError as exc:
        raise AssertionError(f"tasks left running: {[(t.get_name(), t.get_coro()) for t in left()]}") from exc


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


class Socket:
    """A WebSocket session on ``/v1/realtime``, the app called over ASGI in this event loop."""

    def __init__(self, app: Any) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: list[dict[str, Any]] = []
        self.closed: int | None = None
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "ws",
            "path": "/v1/realtime",
            "raw_path": b"/v1/realtime",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {KEY}".encode())],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
            "subprotocols": [],
        }
        self.incoming.put_nowait({"type": "websocket.connect"})
        self.task = asyncio.create_task(app(scope, self.incoming.get, self._send), name="test websocket")

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.send":
            self.events.append(json.loads(message["text"]))
        elif message["type"] == "websocket.close":
            self.closed = message.get("code", 1000)

    async def close(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})
        await self.task


# --- the answer --------------------------------------------------------------------------


def test_an_sdp_offer_is_answered_201_with_the_calls_location_and_a_webrtc_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call, answer = await server.dial()
            assert answer.status_code == 201, answer.text
            assert answer.headers["content-type"].startswith("application/sdp") and answer.text.startswith("v=0\r\n")
            assert re.fullmatch(r"/v1/realtime/calls/rtc_[0-9a-f]{20}", answer.headers["location"])
            assert CANDIDATE.findall(answer.text) and all(
                found == ("127.0.0.1", "host") for found in CANDIDATE.findall(answer.text)
            )
            await call.opened(5)
            created = (await call.next_of("session.created", 5))["session"]
            assert created["transport"] == "webrtc" and created["model"] == "m" and created["type"] == "realtime"
            assert created["audio"]["input"]["echo_guard"] is False  # the browser cancels its own echo
            assert [e["type"] for e in call.events] == ["session.created"]
            assert await server.health() == {
                "sessions": 1,
                "websocket_sessions": 0,
                "webrtc_sessions": 1,
                "peer_connections": 1,
            }
            call_id = answer.headers["location"].rsplit("/", 1)[-1]
            assert f"realtime call {call_id}: session {created['id']} answered" in caplog.messages
            await call.close()
            await server.idle()
            assert ended(caplog) == ["the data channel closed"]
            assert server.state.metrics.count("rejected") == 0

    run(scenario)


def test_a_missing_or_wrong_key_is_401_and_opens_nothing() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            sdp = await offer()
            for headers in ({}, {"Authorization": "Bearer nope"}):
                refused = await server.post(sdp, headers=headers)
                assert refused.status_code == 401
                assert error_of(refused) == {
                    "message": "missing or wrong API key (send 'Authorization: Bearer <key>')",
                    "type": "authentication_error",
                    "code": "invalid_api_key",
                    "param": None,
                }
            _, dialled = await server.dial(key="nope")
            assert dialled.status_code == 401 and "location" not in dialled.headers
            assert server.state.metrics.count("rejected") == 3 and server.pipeline.submitted == []
            assert await server.health() == NOTHING

    run(scenario)


def test_while_starting_a_call_is_503_and_a_topology_without_text_or_audio_is_400() -> None:
    async def scenario() -> None:
        sdp = await offer()
        async with served(None) as starting:
            refused = await starting.post(sdp)
            assert refused.status_code == 503
            assert error_of(refused) == {
                "message": "the pipeline is still starting; retry shortly",
                "type": "server_error",
                "code": "starting",
                "param": None,
            }
        async with served(ScriptedPipeline(topology=topology(False, {"h": "transcript"}))) as hearing:
            refused = await hearing.post(sdp)
            assert refused.status_code == 400
            assert error_of(refused) == {
                "message": "topology 'shaped' has no text or audio terminal: nothing answers a call (a recognizer "
                "alone serves transcription sessions over the WebSocket, /v1/realtime?intent=transcription)",
                "type": "invalid_request_error",
                "code": "unsupported_topology",
                "param": None,
            }
            assert await hearing.health() == NOTHING

    run(scenario)


def test_a_body_not_sent_as_sdp_or_a_form_is_415_naming_its_type() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            sdp = await offer()
            refused = await server.post(sdp, content_type="text/plain")
            assert refused.status_code == 415
            assert error_of(refused) == {
                "message": "Content-Type 'text/plain': send the SDP offer as 'application/sdp', or as the 'sdp' "
                "field of a 'multipart/form-data' form (with an optional 'session' JSON field)",
                "type": "invalid_request_error",
                "code": "unsupported_media_type",
                "param": None,
            }
            untyped = await server.post(sdp, content_type="")
            assert untyped.status_code == 415 and error_of(untyped)["message"].startswith("Content-Type '(none)': ")
            assert server.state.metrics.count("rejected") == 2

    run(scenario)


def test_an_offer_typed_with_parameters_and_bare_newlines_is_answered_and_connects() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call = Call()
            server.peers.append(call)
            await call.pc.setLocalDescription(await call.pc.createOffer())
            lax = "\n  " + call.pc.localDescription.sdp.replace("\r\n", "\n").strip()  # no final newline either
            answer = await server.post(lax, content_type="Application/SDP; charset=utf-8")
            assert answer.status_code == 201, answer.text
            await call.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            await call.opened(5)
            assert (await call.next_of("session.created", 5))["session"]["transport"] == "webrtc"

    run(scenario)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the body is not an SDP offer: it must begin with 'v=0'"),
        (b"hello", "the body is not an SDP offer: it must begin with 'v=0'"),
        (
            b"v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\n",
            "the SDP offer has no media section (m=audio for speech, m=application for events)",
        ),
        (b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n\xff\r\n", "the SDP offer is not UTF-8 text"),
        (OVERSIZED, f"the body is {len(OVERSIZED)} bytes; an SDP offer is at most 65536 bytes"),  # as declared
    ],
)
def test_a_body_that_is_not_an_sdp_offer_is_400_saying_what_is_wrong(body: bytes, message: str) -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            refused = await server.post(body)
            assert refused.status_code == 400, refused.text
            assert error_of(refused) == {
                "message": message,
                "type": "invalid_request_error",
                "code": "invalid_offer",
                "param": "sdp",
            }
            assert server.state.metrics.count("rejected") == 1 and await server.health() == NOTHING

    run(scenario)


def test_a_body_over_the_limit_is_refused_by_what_arrives_when_no_length_is_declared() -> None:
    async def scenario() -> None:
        body = b"v=0\r\n" + b"a=x\r\n" * 14_000

        async def chunked() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 4096):
                yield body[start : start + 4096]

        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            refused = await server.http.post(
                "/v1/realtime/calls", content=chunked(), headers={"Content-Type": "application/sdp", **AUTH}
            )
            assert "content-length" not in refused.request.headers  # only counting what arrives tells
            assert refused.status_code == 400
            assert error_of(refused)["message"] == "the body is over 65536 bytes; an SDP offer is at most 65536 bytes"

    run(scenario)


def test_an_sdp_file_part_over_the_limit_is_refused_by_its_size() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            big = "v=0\r\n" + "a=x\r\n" * 14_000  # a file part: max_part_size does not bound it

            async def chunked() -> AsyncIterator[bytes]:  # no length declared
                boundary = b"--b0undary"
                yield boundary + b'\r\nContent-Disposition: form-data; name="sdp"; filename="offer.sdp"\r\n'
                yield b"Content-Type: application/sdp\r\n\r\n" + big.encode() + b"\r\n" + boundary + b"--\r\n"

            refused = await server.http.post(
                "/v1/realtime/calls",
                content=chunked(),
                headers={"Content-Type": "multipart/form-data; boundary=b0undary", **AUTH},
            )
            assert refused.status_code == 400, refused.text
            assert error_of(refused)["message"] == (
                f"the form's 'sdp' file is {len(big)} bytes; an SDP offer is at most 65536 bytes"
            )
            assert await server.health() == NOTHING

    run(scenario)


def test_an_offer_the_server_cannot_answer_is_400_and_its_call_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            sdp = await offer()
            no_ice = "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith("a=ice-")) + "\r\n"
            no_codec = re.sub(r"a=rtpmap:(\d+) \S+", r"a=rtpmap:\1 FOO/8000", sdp)
            cases = [
                (no_ice, "the SDP offer could not be read: ICE username fragment or password is missing"),
                (no_codec, "the SDP offer could not be read: Failed to set remote audio description send parameters"),
                (
                    await offer(audio=False),
                    "the SDP offer has no audio media section (m=audio): the call needs one for speech",
                ),
                # aiortc's parser asserts on this one: once a 500 that left its peer connection open
                ("v=0\r\nm=audio\r\n", "the SDP offer could not be read: AssertionError"),
            ]
            for body, message in cases:
                refused = await server.post(body)
                assert refused.status_code == 400, refused.text
                assert error_of(refused) == {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": "invalid_offer",
                    "param": "sdp",
                }
                assert await server.health() == NOTHING
            assert ended(caplog) == ["refused"] * 4 and server.state.metrics.count("rejected") == 4

    run(scenario)


# --- the form ----------------------------------------------------------------------------


def test_the_form_s_session_is_applied_before_session_created() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            for as_files in (False, True):  # fields, or files (as a browser's FormData may send them)
                call = Call()
                server.peers.append(call)
                await call.pc.setLocalDescription(await call.pc.createOffer())
                session = json.dumps(
                    {
                        "type": "realtime",
                        "model": "m",
                        "instructions": "Be brief.",
                        "audio": {"input": {"turn_detection": None}},
                    }
                )
                sdp = call.pc.localDescription.sdp
                answer = await server.form(
                    sdp=("offer.sdp", sdp, "application/sdp") if as_files else (None, sdp),
                    session=("session.json", session) if as_files else (None, session),
                )
                assert answer.status_code == 201, answer.text
                call.location = answer.headers["location"]
                await call.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
                await call.opened(5)
                created = (await call.next_of("session.created", 5))["session"]
                assert created["instructions"] == "Be brief." and created["audio"]["input"]["turn_detection"] is None
                assert [e["type"] for e in call.events] == ["session.created"]  # no session.updated before it
                call.send({"type": "session.update", "session": {"instructions": "Be terse."}})
                updated = await call.next_of("session.updated", 5)  # the session sends again
                assert updated["session"]["instructions"] == "Be terse."
                assert [e["type"] for e in call.events] == ["session.created", "session.updated"]

    run(scenario)


def test_the_form_s_refusals_name_the_field() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            sdp = await offer()
            no_sdp = await server.form(session=(None, "{}"))
            assert no_sdp.status_code == 400
            assert error_of(no_sdp) == {
                "message": "the form has no 'sdp' field (the SDP offer)",
                "type": "invalid_request_error",
                "code": "invalid_offer",
                "param": "sdp",
            }
            not_json = await server.form(sdp=(None, sdp), session=(None, "{nope"))
            assert not_json.status_code == 400 and error_of(not_json)["param"] == "session"
            assert error_of(not_json)["message"].startswith("the form's 'session' field is not JSON (Expecting")
            not_object = await server.form(sdp=(None, sdp), session=(None, "[1]"))
            assert not_object.status_code == 400 and error_of(not_object) == {
                "message": "the form's 'session' field must be a JSON object",
                "type": "invalid_request_error",
                "code": "invalid_offer",
                "param": "session",
            }
            bad_field = await server.form(sdp=(None, sdp), session=(None, json.dumps({"max_output_tokens": 0})))
            assert bad_field.status_code == 400
            error = error_of(bad_field)
            assert error["param"] == "session.max_output_tokens" and error["code"] == "invalid_value"
            assert error["message"].startswith("the form's 'session' field: ")
            mistyped = await server.form(sdp=(None, sdp), session=(None, json.dumps({"instructions": 5})))
            assert mistyped.status_code == 400 and error_of(mistyped) == {
                "message": "the form's 'session' field: session.update: Expected `str`, got `int` - at "
                "`$.session.instructions`",
                "type": "invalid_request_error",
                "code": "invalid_value",
                "param": "session.instructions",
            }
            assert server.state.metrics.count("rejected") == 5 and await server.health() == NOTHING
            unknown = await server.form(sdp=(None, sdp), session=(None, json.dumps({"model": "gpt-realtime"})))
            assert unknown.status_code == 404 and error_of(unknown)["code"] == "model_not_found"
            assert error_of(unknown)["param"] == "model"
            # ?model= wins over the session's: it is checked, the session's model is not
            call, answer = await server.dial("?model=m")
            assert answer.status_code == 201
            await call.opened(5)
            call2 = Call()
            server.peers.append(call2)
            await call2.pc.setLocalDescription(await call2.pc.createOffer())
            answer = await server.http.post(
                "/v1/realtime/calls?model=m",
                headers=AUTH,
                files={
                    "sdp": (None, call2.pc.localDescription.sdp),
                    "session": (None, json.dumps({"model": "gpt-realtime"})),
                },
            )
            assert answer.status_code == 201, answer.text
            await call2.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            await call2.opened(5)
            for location in (call.location, answer.headers["location"]):
                assert (await server.hangup(location)).status_code == 200

    run(scenario)


# --- model, intent, the session limit -----------------------------------------------------


def test_a_model_not_served_is_404_and_an_intent_not_known_400_naming_them() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY), aliases=("alias",)) as server:
            sdp = await offer()
            unknown = await server.post(sdp, query="?model=gpt-realtime")
            assert unknown.status_code == 404
            assert error_of(unknown) == {
                "message": "the model 'gpt-realtime' does not exist; this server serves 'm', 'alias'",
                "type": "invalid_request_error",
                "code": "model_not_found",
                "param": "model",
            }
            intent = await server.post(sdp, query="?intent=dictation")
            assert intent.status_code == 400
            assert error_of(intent) == {
                "message": "intent 'dictation' is not one of realtime, transcription",
                "type": "invalid_request_error",
                "code": "invalid_value",
                "param": "intent",
            }
            transcription = await server.post(sdp, query="?intent=transcription")
            assert transcription.status_code == 400
            assert error_of(transcription) == {
                "message": "intent 'transcription': topology 'fast' has no terminal of modality 'transcript'",
                "type": "invalid_request_error",
                "code": "unsupported_session_type",
                "param": "intent",
            }
            assert server.state.metrics.count("rejected") == 3 and await server.health() == NOTHING
            by_alias = await server.connected("?model=alias")
            assert (await by_alias.next_of("session.created"))["session"]["model"] == "alias"

    run(scenario)


def test_a_transcription_intent_opens_a_transcription_session() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=EVERY_ENDPOINT)) as server:
            call = await server.connected("?intent=transcription")
            created = (await call.next_of("session.created"))["session"]
            assert created["type"] == "transcription" and created["transport"] == "webrtc"

    run(scenario)


def test_calls_and_websockets_share_one_session_limit() -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY), limits=Limits(max_realtime_sessions=1)) as server:
            socket = Socket(server.app)
            await until(lambda: socket.events, "the WebSocket's session.created")
            assert socket.events[0]["type"] == "session.created"
            assert await server.health() == {
                "sessions": 1,
                "websocket_sessions": 1,
                "webrtc_sessions": 0,
                "peer_connections": 0,
            }
            _, refused = await server.dial()
            assert refused.status_code == 429
            assert error_of(refused) == {
                "message": "this server runs at most 1 realtime sessions at once (--max-realtime-sessions), "
                "WebSocket and WebRTC together; retry later",
                "type": "rate_limit_error",
                "code": "session_limit_reached",
                "param": None,
            }
            await socket.close()
            assert await server.health() == NOTHING
            await server.connected()
            assert await server.health() == {
                "sessions": 1,
                "websocket_sessions": 0,
                "webrtc_sessions": 1,
                "peer_connections": 1,
            }
            second = Socket(server.app)
            await second.task  # refused in the protocol's words, then closed: "try again later"
            assert [e["error"]["code"] for e in second.events] == ["session_limit_reached"]
            assert second.closed == 1013
            assert server.state.metrics.count("rejected") == 2

    run(scenario)


# --- events on the data channel ----------------------------------------------------------


def test_events_travel_on_the_oai_events_channel_and_bad_ones_are_answered_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        limits = Limits(max_realtime_message_bytes=200)
        async with served(
            ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: text_events(["echo:", "hi"])), limits=limits
        ) as server:
            call = await server.connected()
            for event in ask(output_modalities=["text"]):
                call.send(event)
            done = (await call.next_of("response.done", 5))["response"]
            assert done["status"] == "completed"
            assert "".join(e["delta"] for e in call.events if e["type"] == "response.output_text.delta") == "echo: hi"
            mark = len(call.events)
            call.channel.send("{nope")
            call.channel.send("{nope")
            accented = json.dumps({"type": "session.update", "session": {"instructions": "é" * 80}}, ensure_ascii=False)
            assert len(accented) <= 200 < len(accented.encode())  # characters fit, bytes do not
            call.channel.send(accented)
            call.channel.send(json.dumps({"type": "session.update", "session": {"instructions": "e" * 80}}).encode())
            updated = await call.next_of("session.updated", 5, after=mark)  # bytes are read as text
            assert updated["session"]["instructions"] == "e" * 80
            errors = [e["error"] for e in call.events[mark:] if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["invalid_json", "invalid_json", "message_too_large"]
            assert errors[2]["message"] == (
                f"the message is {len(accented.encode())} bytes; this server takes events "
                "up to 200 bytes (send audio in smaller appends)"
            )
            session_id = (await call.next_of("session.created"))["session"]["id"]
            refusals = [m for m in caplog.messages if m.startswith(f"realtime session {session_id} (webrtc): refused:")]
            assert len(refusals) == 2  # one mistake repeated is logged once
            assert refusals[0].startswith(
                f"realtime session {session_id} (webrtc): refused: the message is not valid JSON"
            )
            assert refusals[0].endswith("(event -)")
            assert f"refused: the message is {len(accented.encode())} bytes" in refusals[1]

    run(scenario)


def test_data_channels_other_than_the_first_oai_events_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call = Call()
            other = call.pc.createDataChannel("other")
            again = call.pc.createDataChannel("oai-events")
            assert (await server.dial(call=call))[1].status_code == 201
            await call.opened(5)
            await until(lambda: other.readyState == "open" and again.readyState == "open", "every channel open")
            await call.next_of("session.created", 5)
            for channel in (other, again):
                channel.send(json.dumps({"type": "session.update", "session": {"instructions": "ignored"}}))
            await until(
                lambda: sum("ignored (events go on 'oai-events')" in m for m in caplog.messages) == 2,
                "both channels ignored",
            )
            call_id = call.location.rsplit("/", 1)[-1]
            assert (
                f"realtime call {call_id}: data channel 'other' ignored (events go on 'oai-events')" in caplog.messages
            )
            assert (
                f"realtime call {call_id}: data channel 'oai-events' ignored (events go on 'oai-events')"
                in caplog.messages
            )
            call.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
            updated = (await call.next_of("session.updated", 5))["session"]
            assert updated["instructions"] == "" and updated["output_modalities"] == ["text"]
            assert [e["type"] for e in call.events] == ["session.created", "session.updated"]

    run(scenario)


# --- the answer's audio on the server's track --------------------------------------------


def test_the_answer_s_audio_plays_on_the_track_in_real_time_and_never_as_delta_events() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: audio_events(4, seconds=0.1))
        async with served(pipeline) as server:
            call = await server.connected()
            arrived: dict[str, float] = {}
            call.channel.on("message", lambda m: arrived.setdefault(json.loads(m)["type"], time.monotonic()))
            await until(lambda: len(call.audio) >= 5, "the track's silence before any answer")
            for event in ask():
                call.send(event)
            done = (await call.next_of("response.done", 5))["response"]
            stopped = await call.next_of("output_audio_buffer.stopped", 5)
            assert done["status"] == "completed" and stopped["response_id"] == done["id"]
            types = [e["type"] for e in call.events]
            assert "response.output_audio.delta" not in types and "response.output_audio.done" in types
            assert types.count("output_audio_buffer.started") == types.count("output_audio_buffer.stopped") == 1
            assert types.index("output_audio_buffer.started") < types.index("response.output_audio_transcript.delta")
            # 0.4 s of audio, played in real time: stopped once the track has sent it
            played_for = arrived["output_audio_buffer.stopped"] - arrived["output_audio_buffer.started"]
            assert 0.3 < played_for < 2.0, played_for
            start = call.marks[f"started:{done['id']}"]
            assert start >= 5 and rms(call.audio[:start]) < 0.001  # silence between answers
            await until(lambda: len(call.audio) >= call.marks[f"stopped:{done['id']}"] + 10, "the answer heard")
            assert float(np.sqrt(np.mean(call.heard(done["id"]) ** 2))) > 0.05  # the tone came through
            assert all(frame.size == FRAME_SAMPLES for frame in call.audio[1:])  # 20 ms frames, as sent

    run(scenario)


def test_cancel_clears_the_track_at_once_and_aborts_the_request() -> None:
    async def scenario() -> None:
        async with served(held_answer()) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            started = await call.next_of("output_audio_buffer.started", 5)
            call.send({"type": "response.cancel"})
            cleared = await call.next_of("output_audio_buffer.cleared", 5)
            done = (await call.next_of("response.done", 5))["response"]
            assert cleared["response_id"] == started["response_id"] == done["id"] and done["status"] == "cancelled"
            assert set(server.pipeline.aborts) == set(server.pipeline.requests)
            mark = call.marks[f"cleared:{done['id']}"]
            await until(lambda: len(call.audio) >= mark + 30, "the track after the clear")
            # the frames still in the receiver's jitter buffer, then silence
            assert rms(call.audio[mark + 20 : mark + 30]) < 0.001
            assert "output_audio_buffer.stopped" not in [e["type"] for e in call.events]
            mark = len(call.events)
            call.send({"type": "output_audio_buffer.clear", "event_id": "c1"})
            error = (await call.next_of("error", 5, after=mark))["error"]
            assert error["message"] == "output_audio_buffer.clear: no audio is playing" and error["event_id"] == "c1"

    run(scenario)


def test_clearing_the_output_buffer_stops_an_answer_that_is_still_playing() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: audio_events(2, seconds=3.0))
        async with served(pipeline) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            done = (await call.next_of("response.done", 5))["response"]
            assert done["status"] == "completed"  # made, but 6 s of it still to play
            call.send({"type": "output_audio_buffer.clear"})
            assert (await call.next_of("output_audio_buffer.cleared", 5))["response_id"] == done["id"]
            assert [e["type"] for e in call.events].count("response.done") == 1
            assert "output_audio_buffer.stopped" not in [e["type"] for e in call.events]

    run(scenario)


def test_the_user_speaking_over_the_answer_clears_the_track() -> None:
    async def scenario() -> None:
        async with served(held_answer(5.0)) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            started = await call.next_of("output_audio_buffer.started", 5)
            call.mic.say(sample("spider_legs")[: RATE * 2])  # a second of speech over the answer
            speech = await call.next_of("input_audio_buffer.speech_started", 5)
            cleared = await call.next_of("output_audio_buffer.cleared", 5)
            done = (await call.next_of("response.done", 5))["response"]
            assert cleared["response_id"] == started["response_id"] == done["id"]
            assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
            types = [e["type"] for e in call.events]
            assert types.index("input_audio_buffer.speech_started") < types.index("output_audio_buffer.cleared")
            assert speech["audio_start_ms"] > 0

    run(scenario, timeout=20)


# --- the microphone ------------------------------------------------------------------------


def test_the_microphone_track_reaches_the_session_resampled_to_24_khz() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: text_events(["ok"]))
        async with served(pipeline) as server:
            call = await server.connected()
            call.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
            await call.next_of("session.updated", 5)
            session = server.server_side(call).session
            assert session is not None
            tone = (0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(int(0.3 * RATE)) / RATE)).astype("<i2")
            call.mic.say(silence(100) + tone.tobytes())
            await until(call.mic.done.is_set, "the microphone said it")
            heard_at = session.audio_ms
            await until(lambda: session.audio_ms >= heard_at + 400, "the rest of it heard")
            call.send({"type": "input_audio_buffer.commit"})
            for event in ask(output_modalities=["text"])[1:]:
                call.send(event)
            await call.next_of("response.done", 5)
            [(inputs, *_)] = pipeline.submitted
            [audio] = inputs.last_user_message().audio()
            assert audio.sample_rate == RATE
            assert audio.samples.size == pytest.approx(session.audio_ms * RATE / 1000)  # the whole buffer
            windows = audio.samples[: audio.samples.size // 240 * 240].reshape(-1, 240)  # of 10 ms
            loud = int(np.sum(np.sqrt(np.mean(windows**2, axis=1)) > 0.1))  # the tone's RMS is 0.21
            assert 27 <= loud <= 33, loud  # the tone's 0.3 s, at 24 kHz, and nothing else

    run(scenario)


def test_microphone_audio_past_the_buffer_limit_is_refused_with_an_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        limit = int(0.3 * RATE) * 2
        async with served(
            ScriptedPipeline(topology=CHAT_ONLY), limits=Limits(max_realtime_buffer_bytes=limit)
        ) as server:
            call = Call()
            server.peers.append(call)
            await call.pc.setLocalDescription(await call.pc.createOffer())
            answer = await server.form(
                sdp=(None, call.pc.localDescription.sdp),
                session=(None, json.dumps({"audio": {"input": {"turn_detection": None}}})),
            )
            assert answer.status_code == 201, answer.text
            await call.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            error = (await call.next_of("error", 5))["error"]
            assert error == {
                "type": "invalid_request_error",
                "code": "input_audio_buffer_too_large",
                "message": f"the input audio buffer is limited to {limit} bytes (0 s of audio); commit or clear it",
                "param": "audio",
                "event_id": None,
            }
            await until(lambda: [e["type"] for e in call.events].count("error") >= 3, "each piece refused")
            session_id = (await call.next_of("session.created"))["session"]["id"]
            [logged] = [m for m in caplog.messages if m.startswith(f"realtime session {session_id} (webrtc): refused")]
            assert logged.endswith("(piece of microphone audio -)")
            mark = len(call.events)
            call.send({"type": "input_audio_buffer.commit"})  # what fit, in 100 ms pieces, is there
            await call.next_of("input_audio_buffer.committed", 5, after=mark)
            assert "input_audio_buffer_commit_empty" not in [e.get("error", {}).get("code") for e in call.events]

    run(scenario)


def test_a_session_that_falls_behind_drops_what_arrives_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, LOG)
    monkeypatch.setattr(webrtc, "INBOX_ITEMS", 3)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call = await server.connected()
            inside = server.server_side(call)
            free = 3 - inside.inbox.qsize()
            for _ in range(free + 100):  # all at once: the session reads none of them meanwhile
                inside.message(json.dumps({"type": "input_audio_buffer.clear"}))
            assert inside.dropped == 100
            behind = [m for m in caplog.messages if "the session is behind" in m]
            assert behind == [
                f"realtime call {inside.id}: the session is behind (3 items waiting); dropped 1 item(s) so far "
                "(the last: event)",
                f"realtime call {inside.id}: the session is behind (3 items waiting); dropped 100 item(s) so far "
                "(the last: event)",
            ]
            call.send({"type": "session.update", "session": {"instructions": "last"}})
            await call.next_of("session.updated", 5)
            assert [e["type"] for e in call.events].count("input_audio_buffer.cleared") == free

    run(scenario)


# --- how a call ends -----------------------------------------------------------------------


def test_hangup_ends_the_call_and_what_it_was_answering(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(held_answer()) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            await call.next_of("output_audio_buffer.started", 5)
            assert server.pipeline.in_flight() == 1 and len(server.state.active) == 1
            assert (await server.hangup(call.location, headers={})).status_code == 401
            missing = await server.hangup("/v1/realtime/calls/rtc_nope")
            assert missing.status_code == 404
            assert error_of(missing) == {
                "message": "no call 'rtc_nope' is open",
                "type": "invalid_request_error",
                "code": "not_found",
                "param": None,
            }
            call_id = call.location.rsplit("/", 1)[-1]
            hung = await server.hangup(call.location)
            assert hung.status_code == 200 and hung.json() == {"id": call_id, "status": "hung up"}
            await until(lambda: call.channel.readyState == "closed", "the client's data channel closed")
            await server.idle()
            assert set(server.pipeline.aborts) == set(server.pipeline.requests)
            assert ended(caplog) == ["hung up by the client"]
            assert (await server.hangup(call.location)).status_code == 404

    run(scenario)


def test_closing_the_data_channel_ends_the_call_and_aborts_what_it_was_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(held_answer()) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            await call.next_of("output_audio_buffer.started", 5)
            call.channel.close()  # the peer connection stays: the server closes it
            await until(lambda: call.pc.connectionState == "closed", "the server closed the peer connection")
            await server.idle()
            assert set(server.pipeline.aborts) == set(server.pipeline.requests) and server.pipeline.in_flight() == 0
            assert ended(caplog) == ["the data channel closed"]

    run(scenario)


def test_a_call_without_an_events_channel_ends_when_its_peer_connection_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            server.peers.append(pc)
            pc.addTrack(Microphone())
            await pc.setLocalDescription(await pc.createOffer())
            answer = await server.post(pc.localDescription.sdp)
            assert answer.status_code == 201, answer.text
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            await until(lambda: pc.connectionState == "connected", "connected")
            assert (await server.health())["peer_connections"] == 1
            await pc.close()
            await server.idle()
            assert ended(caplog) == ["the peer connection closed"]

    run(scenario)


def test_a_call_that_does_not_connect_in_time_is_closed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY), limits=Limits(realtime_connect_timeout_s=0.2)) as server:
            answered = time.monotonic()
            answer = await server.post(await offer())  # and the answer is never applied: no ICE, no DTLS
            assert answer.status_code == 201
            assert (await server.health())["peer_connections"] == 1
            await server.idle()
            assert time.monotonic() - answered >= 0.2
            assert ended(caplog) == ["it did not connect within 0.2 s (--call-connect-timeout)"]

    run(scenario)


def test_a_call_on_which_nothing_arrives_is_closed_after_the_idle_timeout(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, LOG)
    monkeypatch.setattr(webrtc, "IDLE_TIMEOUT_S", 0.3)

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call = await server.connected()
            inside = server.server_side(call)
            await until(lambda: time.monotonic() - inside.last_heard < 0.15, "the microphone heard")
            call.mic.stop()  # the microphone is switched off; events still keep the call
            last = time.monotonic()
            for _ in range(6):  # 0.6 s, twice the timeout
                await asyncio.sleep(0.1)
                call.send({"type": "input_audio_buffer.clear"})
                last = time.monotonic()
            assert (await server.health())["peer_connections"] == 1 and ended(caplog) == []
            await server.idle()
            assert time.monotonic() - last >= 0.25
            assert ended(caplog) == ["nothing arrived on it for 0.3 s"]

    run(scenario)


def test_a_client_that_does_not_read_its_events_is_hung_up(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: text_events(["w"] * 200))
        async with served(pipeline, limits=Limits(max_realtime_outbox_bytes=1000)) as server:
            call = await server.connected()
            for event in ask(output_modalities=["text"]):
                call.send(event)
            await until(lambda: call.channel.readyState == "closed", "the server hung up")
            await server.idle()
            [why] = ended(caplog)
            assert re.fullmatch(r"the client is not reading its events \(\d+ characters waiting\)", why), why
            assert "response.done" not in [e["type"] for e in call.events]

    run(scenario)


def test_the_server_stopping_ends_its_calls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)

    async def scenario() -> None:
        async with served(held_answer()) as server:
            calls = [await server.connected(), await server.connected()]
            for event in ask():
                calls[0].send(event)
            await calls[0].next_of("output_audio_buffer.started", 5)
            await stopping(server.state)
            assert server.calls.open == {} and await server.health() == NOTHING  # ended before it returns
            assert set(server.pipeline.aborts) == set(server.pipeline.requests) and not server.state.active
            await until(lambda: all(c.channel.readyState == "closed" for c in calls), "the clients' channels closed")
            assert ended(caplog) == ["the server is stopping"] * 2

    run(scenario)


# --- ICE -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "offered"),
    [
        ("http://127.0.0.1", "127.0.0.1"),
        ("http://127.0.0.2", "127.0.0.2"),  # where the offer came in
        ("http://0.0.0.0", "127.0.0.1"),  # no one address: every interface's (here aioice's, loopback-only)
    ],
)
def test_ice_offers_the_address_the_offer_came_in_on(base_url: str, offered: str) -> None:
    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY), base_url=base_url) as server:
            call, answer = await server.dial()
            assert answer.status_code == 201
            assert CANDIDATE.findall(answer.text) == [(offered, "host")] * 2  # audio and the data channel
            await call.opened(5)

    run(scenario)


def test_omnictl_webrtc_hosts_chooses_the_addresses_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOSTS_ENV, " 127.0.0.3 , ")

    async def scenario() -> None:
        async with served(ScriptedPipeline(topology=CHAT_ONLY)) as server:
            call, answer = await server.dial()
            assert answer.status_code == 201
            assert CANDIDATE.findall(answer.text) == [("127.0.0.3", "host")] * 2
            await call.opened(5)
            filtered = aioice.ice.get_host_addresses
            create_app(ServingState(model_name="m"))  # another app: the filter is installed once per process
            assert aioice.ice.get_host_addresses is filtered and getattr(filtered, "omnictl", False)
            monkeypatch.setenv(HOSTS_ENV, "127.0.0.3,::1")
            restrict_to("127.0.0.1")  # in this task's context, as an offer's answer sets it
            assert filtered(True, True) == ["127.0.0.3", "::1"]
            assert filtered(True, False) == ["127.0.0.3"] and filtered(False, True) == ["::1"]
            monkeypatch.delenv(HOSTS_ENV)
            restrict_to("::")
            assert filtered(True, True) == ["127.0.0.1"]  # aioice's own lookup (here the loopback-only one)
            restrict_to("127.0.0.1")

    run(scenario)


# --- the answer track itself -----------------------------------------------------------------


def pcm(ms: int, start: int = 1) -> bytes:
    """``ms`` of pcm16 at 24 kHz counting up from ``start``: each sample tells where it came from."""
    return (np.arange(ms * RATE // 1000, dtype="<i2") + start).tobytes()


def track_and_events() -> tuple[AnswerTrack, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []

    def send(event: ev.ServerEvent) -> None:
        sent = json.loads(ev.encode(event))
        said.append((sent["type"].split(".")[-1], sent["response_id"]))

    return AnswerTrack(send), said


def test_the_answer_track_sends_20_ms_frames_of_the_answer_then_silence() -> None:
    async def scenario() -> None:
        track, said = track_and_events()
        track.play("r1", pcm(30))
        assert said == [("started", "r1")]  # at once, before any frame
        frames = [await track.recv() for _ in range(3)]
        for index, frame in enumerate(frames):
            assert (frame.samples, frame.sample_rate, frame.pts) == (FRAME_SAMPLES, RATE, index * FRAME_SAMPLES)
            assert frame.time_base == fractions.Fraction(1, RATE)
            assert (frame.format.name, frame.layout.name) == ("s16", "mono")
        played = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
        assert np.array_equal(played[:720], np.frombuffer(pcm(30), "<i2")) and not played[720:].any()
        assert track.played_samples == 720 and said == [("started", "r1")]  # not finished: still playing
        track.finish("r1")  # all of it played: stopped now
        assert said == [("started", "r1"), ("stopped", "r1")]
        track.play("r2", pcm(10))
        track.play("r2", pcm(10, start=241))  # more of the same answer: played on
        both = (await track.recv()).to_ndarray().reshape(-1)
        assert np.array_equal(both, np.frombuffer(pcm(20), "<i2"))
        assert said[2:] == [("started", "r2")]
        track.stop()
        with pytest.raises(MediaStreamError):
            await track.recv()

    run(scenario)


def test_the_answer_track_says_started_and_stopped_once_per_answer_in_order() -> None:
    async def scenario() -> None:
        track, said = track_and_events()
        track.play("a", pcm(30))
        track.finish("a")  # finished while queued: stopped once played
        track.play("b", pcm(20, start=1000))
        track.finish("nobody")
        assert said == [("started", "a")]
        await track.recv()
        assert said == [("started", "a")]
        second = (await track.recv()).to_ndarray().reshape(-1)  # a's last 10 ms, then b's first 10 ms
        assert np.array_equal(
            second,
            np.frombuffer(pcm(30), "<i2")[480:].tolist() + np.frombuffer(pcm(20, start=1000), "<i2")[:240].tolist(),
        )
        assert said == [("started", "a"), ("stopped", "a"), ("started", "b")]
        await track.recv()
        assert said[-1] == ("started", "b")  # all of b played, but b may send more
        track.play("c", pcm(40))  # queued after b: b stops when c starts
        track.finish("c")
        await track.recv()
        assert said[3:] == [("stopped", "b"), ("started", "c")]
        await track.recv()
        assert said[5:] == [("stopped", "c")]  # c's last frame drained what was finished
        assert track.played_samples == 90 * RATE // 1000
        track.finish("c")
        assert len(said) == 6

    run(scenario)


def test_clearing_the_answer_track_drops_what_it_holds_and_says_so() -> None:
    async def scenario() -> None:
        track, said = track_and_events()
        assert track.clear() is False and said == []
        track.play("a", pcm(100))
        await track.recv()
        assert track.clear() is True and said == [("started", "a"), ("cleared", "a")]
        assert not (await track.recv()).to_ndarray().any()  # silence at once
        track.finish("a")  # no longer playing: nothing to stop
        assert track.clear() is False and len(said) == 2
        track.play("b", pcm(20))
        track.finish("b")
        assert track.clear() is True and said[2:] == [("started", "b"), ("cleared", "b")]
        track.play("b", pcm(20))  # the same id again: a new start, not finished
        await track.recv()
        assert said[4:] == [("started", "b")]
        assert track.played_samples == 2 * FRAME_SAMPLES

    run(scenario)


def test_the_answer_track_paces_its_frames_in_real_time_and_does_not_rush_after_a_held_loop() -> None:
    async def scenario() -> None:
        track, _ = track_and_events()
        began = time.monotonic()
        for _ in range(6):
            await track.recv()
        assert 0.095 < time.monotonic() - began < 0.5  # the first at once, then one each 20 ms
        time.sleep(0.3)  # the loop is held: 15 frames late
        began = time.monotonic()
        frames = [await track.recv() for _ in range(4)]
        assert time.monotonic() - began > 0.055  # played on from now, not 15 frames at once
        assert [f.pts for f in frames] == [n * FRAME_SAMPLES for n in range(6, 10)]

    run(scenario)


def test_the_outbox_holds_one_event_of_any_size_and_overflows_past_its_bound() -> None:
    async def scenario() -> None:
        outbox = Outbox(limit=60)
        big = ev.SessionUpdated(
            session=ev.SessionObject(
                id="s", model="m" * 100, instructions="", output_modalities=[], audio={}, max_output_tokens="inf"
            )
        )
        outbox.put(big)  # bigger than the bound, into an empty outbox: it fits
        assert outbox.pending == len(ev.encode(big)) and not outbox.overflowed.is_set()
        outbox.put(ev.Cleared())
        assert outbox.overflowed.is_set() and outbox.pending == len(ev.encode(big))
        assert await outbox.get() == ev.encode(big) and outbox.pending == 0
        outbox.put(ev.Cleared())  # after an overflow nothing more is queued
        outbox.close()
        assert await outbox.get() is None
        fresh = Outbox(limit=1000)
        waiting = asyncio.ensure_future(fresh.get())
        await asyncio.sleep(0)
        fresh.put(ev.Cleared())
        assert json.loads(await waiting or "null")["type"] == "input_audio_buffer.cleared"
        fresh.close()
        fresh.put(ev.Cleared())  # closed: dropped
        assert await fresh.get() is None and fresh.pending == 0

    run(scenario)
