"""``POST /v1/realtime/calls`` on the fast test topology (no models): an aiortc client on
loopback gets an SDP answer, events on ``oai-events``, the answer's audio on a track and
never as events; wrong keys, bodies and fields are refused naming what is wrong; and 20
sessions dropped mid-answer, WebSocket and WebRTC mixed, leave nothing behind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from omnictl.serving.chat.protocol import Limits
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening
from tests.serving.harness import (
    API_KEY,
    FAST_TOPOLOGY,
    ServerProcess,
    serving_in_process,
    start_server,
    stop_server,
    wait_until,
)
from tests.serving.realtime.rtc import Call, loopback_only
from tests.serving.realtime.speech import sample, silence
from tests.support.held import held_by

loopback_only()


def _health(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()


def _idle(server: ServerProcess) -> bool:
    health = _health(server)
    stages = health["stages"].values()
    return (health["in_flight"] == 0 and health["pipeline_in_flight"] == 0
            and health["realtime"] == {"sessions": 0, "websocket_sessions": 0, "webrtc_sessions": 0, "peer_connections": 0}
            and all(s.get("requests", 0) == 0 and s.get("slots_in_use", 0) == 0 for s in stages))


def _threads() -> list[str]:
    """This process's threads but the worker pool's (asyncio's default executor, ``asyncio_N``), by name."""
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith("asyncio_"))


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"type": "conversation.item.create",
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}},
            {"type": "response.create", "response": {"output_modalities": ["text", "audio"]}}]


def test_a_call_answers_over_the_data_channel_and_speaks_on_its_track(server: ServerProcess) -> None:
    async def run() -> None:
        call = Call()
        try:
            answer = await call.dial(server.url, API_KEY, "?model=fast")
            assert answer.status_code == 201, answer.text
            assert answer.headers["content-type"].startswith("application/sdp") and answer.text.startswith("v=0")
            assert re.fullmatch(r"/v1/realtime/calls/rtc_\w+", call.location), call.location
            # only loopback candidates are offered: the server is bound to 127.0.0.1
            candidates = re.findall(r"a=candidate:\S+ \d \w+ \d+ (\S+) \d+ typ (\w+)", answer.text)
            assert candidates and all(address == "127.0.0.1" and kind == "host" for address, kind in candidates), candidates
            await call.opened()
            created = await call.next_of("session.created")
            assert created["session"]["transport"] == "webrtc"
            assert created["session"]["audio"]["input"]["echo_guard"] is False  # the browser cancels echo
            assert _health(server)["realtime"]["peer_connections"] == 1
            for event in _ask("hello there"):
                call.send(event)
            done = (await call.next_of("response.done"))["response"]
            assert done["status"] == "completed"
            stopped = await call.next_of("output_audio_buffer.stopped")
            types = [e["type"] for e in call.events]
            assert "response.output_audio.delta" not in types  # the audio went on the track
            assert types.index("output_audio_buffer.started") < types.index("output_audio_buffer.stopped")
            assert stopped["response_id"] == done["id"]
            text = "".join(e["delta"] for e in call.events if e["type"] == "response.output_text.delta")
            assert text == "echo: hello there"
            heard = call.heard(done["id"])
            # the fast speaker says one tone per word: its energy is on the track, paced in real time
            assert np.sqrt(np.mean(heard**2)) > 0.01, "the answer track is silent"
            transcript = (await call.next_of("response.output_audio_transcript.done"))["transcript"]
            assert transcript.split() == text.split()
        finally:
            await call.close()

    asyncio.run(run())
    wait_until(lambda: _health(server)["realtime"]["peer_connections"] == 0, timeout=15)


def test_the_form_s_session_field_configures_the_session_before_it_is_created(server: ServerProcess) -> None:
    async def run() -> None:
        call = Call()
        try:
            await call.pc.setLocalDescription(await call.pc.createOffer())
            session = {"type": "realtime", "model": "fast", "instructions": "Be brief.",
                       "audio": {"input": {"turn_detection": None}}}
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.post(server.url + "/v1/realtime/calls", headers={"Authorization": f"Bearer {API_KEY}"},
                                           files={"sdp": (None, call.pc.localDescription.sdp),
                                                  "session": (None, json.dumps(session))})
            assert answer.status_code == 201, answer.text
            call.location = answer.headers["location"]
            await call.pc.setRemoteDescription(type(call.pc.localDescription)(sdp=answer.text, type="answer"))
            await call.opened()
            created = (await call.next_of("session.created"))["session"]
            assert created["instructions"] == "Be brief." and created["audio"]["input"]["turn_detection"] is None
            assert not any(e["type"] == "session.updated" for e in call.events)
            # hung up by the client: the peer connection is closed at once
            async with httpx.AsyncClient(timeout=30) as client:
                hangup = await client.post(server.url + call.location + "/hangup", headers={"Authorization": f"Bearer {API_KEY}"})
            assert hangup.status_code == 200, hangup.text
            wait_until(lambda: _health(server)["realtime"]["peer_connections"] == 0, timeout=15)
        finally:
            await call.close()

    asyncio.run(run())


async def _offer() -> str:
    pc = Call().pc
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def test_keys_bodies_and_fields_are_refused_naming_what_is_wrong(server: ServerProcess) -> None:
    sdp = asyncio.run(_offer())
    calls = server.url + "/v1/realtime/calls"
    key = {"Authorization": f"Bearer {API_KEY}"}

    def post(headers: dict[str, str] | None = None, query: str = "", **body: Any) -> httpx.Response:
        body = body or {"content": sdp, "headers": {"Content-Type": "application/sdp", **key}}
        if headers is not None:
            body["headers"] = headers
        return httpx.post(calls + query, timeout=30, **body)

    def error(response: httpx.Response) -> dict[str, Any]:
        return response.json()["error"]

    for headers in ({"Content-Type": "application/sdp"}, {"Content-Type": "application/sdp", "Authorization": "Bearer nope"}):
        refused = post(headers)
        assert refused.status_code == 401 and error(refused)["code"] == "invalid_api_key", refused.text
    wrong_type = post(content=sdp, headers={"Content-Type": "text/plain", **key})
    assert wrong_type.status_code == 415 and "application/sdp" in error(wrong_type)["message"]
    for body, says in ((b"", "v=0"), (b"hello", "v=0"), (b"v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\n", "no media section")):
        bad = post(content=body, headers={"Content-Type": "application/sdp", **key})
        assert bad.status_code == 400 and says in error(bad)["message"] and error(bad)["param"] == "sdp", bad.text
    video_only = sdp.replace("m=audio", "m=video")
    bad = post(content=video_only, headers={"Content-Type": "application/sdp", **key})
    assert bad.status_code == 400 and error(bad)["param"] == "sdp", bad.text
    no_sdp = post(headers=key, files={"session": (None, "{}")})
    assert no_sdp.status_code == 400 and "'sdp' field" in error(no_sdp)["message"]
    not_json = post(headers=key, files={"sdp": (None, sdp), "session": (None, "{nope")})
    assert not_json.status_code == 400 and error(not_json)["param"] == "session"
    bad_field = post(headers=key, files={"sdp": (None, sdp), "session": (None, json.dumps({"max_output_tokens": 0}))})
    assert bad_field.status_code == 400 and error(bad_field)["param"] == "session.max_output_tokens", bad_field.text
    unknown = post(query="?model=gpt-realtime")
    assert unknown.status_code == 404 and error(unknown)["code"] == "model_not_found" and "'fast'" in error(unknown)["message"]
    intent = post(query="?intent=dictation")
    assert intent.status_code == 400 and error(intent)["param"] == "intent"
    wait_until(lambda: _idle(server), timeout=15)  # nothing refused was left open


SESSIONS = 10  # the in-process server's --max-realtime-sessions


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:
    """The fast topology served from a thread of this process, so that the test reads what its
    pipeline holds (tests/support/held.py) and its own state, not only /health."""
    options = ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=0, api_key=API_KEY),
                          # every one of a wave may be connecting at once
                          limits=Limits(max_realtime_sessions=SESSIONS, max_realtime_connecting=SESSIONS),
                          ).launching(run_dir=tmp_path_factory.mktemp("run"))
    with serving_in_process(options) as listening:
        yield listening


async def _drop_websocket(url: str) -> None:
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=fast"
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None) as ws:
        for event in _ask("please answer slowly " + "word " * 30):
            await ws.send(json.dumps(event))
        while json.loads(await ws.recv())["type"] != "response.output_audio.delta":
            pass
    # closed mid-answer


async def _drop_call(url: str) -> None:
    call = Call()
    answer = await call.dial(url, API_KEY, "?model=fast")
    assert answer.status_code == 201, answer.text
    await call.opened()
    for event in _ask("please answer slowly " + "word " * 30):
        call.send(event)
    await call.next_of("output_audio_buffer.started", timeout=30)
    await call.close()  # gone mid-answer: its data channel and connection close


@pytest.mark.slow
def test_twenty_sessions_dropped_mid_answer_leave_nothing_behind(in_process: Listening, caplog: pytest.LogCaptureFixture) -> None:
    url, state, loop = in_process.url, in_process.state, in_process.loop
    assert loop is not None
    caplog.set_level(logging.INFO, logger="omnictl.serving.realtime")

    async def wave(size: int) -> None:  # in waves of ten: the server runs ten sessions at most
        await asyncio.gather(*(_drop_call(url) if i % 2 else _drop_websocket(url) for i in range(size)))

    def calls() -> dict[str, int]:
        return httpx.get(url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()["realtime"]

    nothing = {"sessions": 0, "websocket_sessions": 0, "webrtc_sessions": 0, "peer_connections": 0}
    asyncio.run(wave(10))
    wait_until(lambda: calls() == nothing and not state.active, timeout=30)
    before = _threads()
    asyncio.run(wave(10))
    wait_until(lambda: calls() == nothing, timeout=30)  # no session, no peer connection
    wait_until(lambda: not state.active, timeout=30)
    metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
    assert float(next(line for line in metrics.splitlines() if line.startswith("omnictl_requests_in_flight ")).split()[-1]) == 0
    # and the pipeline holds nothing for them: no record, slot or stage state anywhere
    assert asyncio.run_coroutine_threadsafe(held_by(in_process.pipeline, timeout=15), loop).result(60) == []
    # No thread of their own is left: only the worker pools' threads (asyncio's default executor,
    # which grows on demand to its bound) may have grown since the first ten.
    try:
        wait_until(lambda: _threads() == before, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"threads before: {before}; now: {_threads()}") from exc
    # The server loop's own pool, not every ``asyncio_N`` thread: each event loop names its pool's
    # threads asyncio_0, asyncio_1, ... and this process may run other loops (CI once counted
    # two asyncio_0s). Read through the loop, since threads carry no owner.
    pool = loop._default_executor  # type: ignore[attr-defined]  # CPython's BaseEventLoop field
    workers = sorted(t.name for t in pool._threads) if pool is not None else []
    assert len(workers) <= min(32, (os.cpu_count() or 1) + 4), workers  # ThreadPoolExecutor's default bound
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("realtime call rtc_")
             and " ended: " in r.getMessage()]
    assert len(ended) == 10, ended  # each of the ten calls closed, and said why
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures  # a client hanging up mid-answer is no server error


def test_the_microphone_track_is_heard_by_server_vad_and_answered(server: ServerProcess) -> None:
    async def run() -> list[dict[str, Any]]:
        call = Call()
        try:
            assert (await call.dial(server.url, API_KEY, "?model=fast")).status_code == 201
            await call.opened()
            call.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "audio": {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}})
            await call.next_of("session.updated")
            call.mic.say(silence(300) + sample("spider_legs") + silence(300))
            await call.next_of("response.done", timeout=60)
            return call.events
        finally:
            await call.close()

    events = asyncio.run(run())
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] - started["audio_start_ms"] > 1000  # the question, not a blip
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    # the fast topology hears the committed turn itself: its samples, resampled to 24 kHz
    samples = int(re.fullmatch(r"echo: audio\((\d+) samples at 24000 Hz\)", text).group(1))  # type: ignore[union-attr]
    assert 24_000 * 1.0 < samples < 24_000 * 6, text


def test_a_server_that_stops_ends_its_calls() -> None:
    own = start_server(str(FAST_TOPOLOGY), "--api-key", API_KEY)
    try:
        async def run() -> str:
            call = Call()
            try:
                assert (await call.dial(own.url, API_KEY, "?model=fast")).status_code == 201
                await call.opened()
                for event in _ask("please answer slowly " + "word " * 30):
                    call.send(event)
                await call.next_of("output_audio_buffer.started", timeout=30)
                stopping = asyncio.get_running_loop().run_in_executor(None, stop_server, own)
                deadline = asyncio.get_running_loop().time() + 30
                while call.channel.readyState == "open" and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                assert await stopping == 0, own.text()
                return call.channel.readyState
            finally:
                await call.close()

        assert asyncio.run(run()) == "closed"
        assert re.search(r"realtime call rtc_\w+ ended: the server is stopping", own.text()), own.text()
        assert "Traceback" not in own.text(), own.text()
    finally:
        if own.process.poll() is None:
            own.process.kill()


def test_calls_and_websockets_share_one_session_limit(in_process: Listening) -> None:
    url = in_process.url

    async def run() -> httpx.Response:
        ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=fast"
        sockets = [await connect(ws_url, additional_headers={"Authorization": f"Bearer {API_KEY}"}) for _ in range(SESSIONS)]
        try:
            for ws in sockets:
                assert json.loads(await ws.recv())["type"] == "session.created"
            assert httpx.get(url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()["realtime"]["websocket_sessions"] == SESSIONS
            call = Call()
            try:
                return await call.dial(url, API_KEY, "?model=fast")
            finally:
                await call.close()
        finally:
            for ws in sockets:
                await ws.close()

    refused = asyncio.run(run())
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "session_limit_reached" and "WebSocket and WebRTC together" in error["message"]
    wait_until(lambda: httpx.get(url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()["realtime"]["sessions"] == 0, timeout=15)


def test_cancel_and_barge_in_clear_the_track_at_once(server: ServerProcess) -> None:
    async def run() -> Call:
        call = Call()
        try:
            assert (await call.dial(server.url, API_KEY, "?model=fast")).status_code == 201
            await call.opened()
            call.send({"type": "session.update", "session": {"type": "realtime", "audio": {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}})
            await call.next_of("session.updated")
            for event in _ask("please answer slowly " + "word " * 30):
                call.send(event)
            first = (await call.next_of("output_audio_buffer.started"))["response_id"]
            call.send({"type": "response.cancel"})
            cleared = await call.next_of("output_audio_buffer.cleared")
            assert cleared["response_id"] == first
            assert (await call.next_of("response.done"))["response"]["status"] == "cancelled"
            mark = len(call.events)
            for event in _ask("please answer slowly " + "word " * 30):
                call.send(event)
            second = (await call.next_of("output_audio_buffer.started", after=mark))["response_id"]
            await asyncio.sleep(1.0)  # a second of the answer plays
            call.mic.say(sample("spider_legs"))  # and the user speaks over it
            assert (await call.next_of("input_audio_buffer.speech_started", after=mark))
            assert (await call.next_of("output_audio_buffer.cleared", after=mark))["response_id"] == second
            done = await call.next_of("response.done", after=mark)
            assert done["response"]["status"] == "cancelled" and done["response"]["status_details"]["reason"] == "turn_detected"
            truncated = await call.next_of("conversation.item.truncated", after=mark)
            # cut at what the track played: the fast speaker's tones come slower than real time,
            # so all that was sent by the barge-in (a second and the VAD's wait), and nothing more
            assert 100 <= truncated["audio_end_ms"] <= 3000, truncated
            await asyncio.sleep(1.0)  # the user is still speaking: the track must stay silent
            return call
        finally:
            await call.close()

    call = asyncio.run(run())
    # nothing of either answer played after it was cleared: the track went silent at once.
    # The frames recorded here lag the events by the receiver's jitter buffer: 20 frames
    # (400 ms) of margin, then up to the next answer's start.
    starts = sorted(index for key, index in call.marks.items() if key.startswith("started:"))
    windows = {}
    for key, cleared_at in call.marks.items():
        if key.startswith("cleared:"):
            until = min([cleared_at + 50, *(i for i in starts if i > cleared_at)])
            windows[key] = call.audio[cleared_at + 20 : until]
    assert len(windows) == 2 and len(max(windows.values(), key=len)) >= 25, {k: len(v) for k, v in windows.items()}
    for key, frames in windows.items():
        if frames:
            after = np.concatenate(frames).astype(np.float32) / 32768.0
            assert np.sqrt(np.mean(after**2)) < 0.005, f"{key}: the answer went on playing after it was cleared"


def test_which_addresses_ice_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnictl.serving.realtime.ice import HOSTS_ENV, candidate_hosts

    monkeypatch.delenv(HOSTS_ENV, raising=False)
    assert candidate_hosts("127.0.0.1") == ["127.0.0.1"] and candidate_hosts("::1") == ["::1"]  # where the offer came in
    assert candidate_hosts("192.0.2.7") == ["192.0.2.7"]
    assert candidate_hosts("0.0.0.0") is None and candidate_hosts("::") is None and candidate_hosts(None) is None
    monkeypatch.setenv(HOSTS_ENV, " 192.0.2.7, 127.0.0.1 ")
    assert candidate_hosts("0.0.0.0") == ["192.0.2.7", "127.0.0.1"] == candidate_hosts("127.0.0.1")


def test_without_aiortc_the_endpoint_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from starlette.requests import Request

    from omnictl.serving.realtime.calls import webrtc_calls
    from omnictl.serving.realtime.channel import RealtimeHub
    from omnictl.serving.state import ServingState

    monkeypatch.setitem(sys.modules, "aiortc", None)  # as on a server installed without the demo extra
    monkeypatch.delitem(sys.modules, "omnictl.serving.realtime.webrtc", raising=False)
    calls = webrtc_calls(RealtimeHub(ServingState(model_name="fast")))
    answer = asyncio.run(calls.create(Request({"type": "http", "method": "POST", "headers": []})))
    assert answer.status_code == 501 and b"omnictl[demo]" in answer.body and b"'aiortc'" in answer.body
    assert calls.stats()["peer_connections"] == 0
