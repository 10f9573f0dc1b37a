"""What the routes do about clients that do not behave: a body that stalls or stops half-way,
a client that leaves while its answer is being made, a stream whose production raises; and
admission by continuity (``--max-underrun-ms``). The app is called over ASGI in the test
process (a client that leaves is a ``http.disconnect``), against a scripted pipeline."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import AudioChunk
from omnictl.profiling.events import EventKind
from omnictl.serving.app import LIVENESS_EVERY_S, create_app, watch_liveness
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.common.tracking import Tracked
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline, ScriptedRequest, audio_events, behind_stream, text_events
from tests.test_inputs import tone, wav_bytes

CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
SPEECH = json.dumps({"input": "Hello.", "response_format": "pcm"}).encode()


class Exchange:
    """One HTTP exchange over ASGI: the body sent in ``parts``, then the client either
    waits (``then="wait"``: the next receive blocks until the response is over) or leaves
    (``"leave"``: ``http.disconnect``), or stalls mid-body (``"stall"``)."""

    def __init__(self, path: str, parts: list[bytes], then: str = "wait",
                 content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
        self.path, self.then = path, then
        self.incoming: list[dict[str, Any]] = [
            {"type": "http.request", "body": p, "more_body": i < len(parts) - 1 or then == "stall"}
            for i, p in enumerate(parts)
        ]
        self.headers = [(b"host", b"localhost"), (b"content-type", content_type.encode())]
        self.headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.sent: list[dict[str, Any]] = []
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.incoming:
            return self.incoming.pop(0)
        if self.then == "leave":
            return {"type": "http.disconnect"}
        await self.done.wait()  # a client still there (or stalled): nothing more comes
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def run(self, app: Any) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": self.path, "raw_path": self.path.encode(), "query_string": b"",
                 "root_path": "", "headers": self.headers, "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8000)}
        try:
            await asyncio.wait_for(app(scope, self.receive, self.send), 5)
        finally:
            self.done.set()

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def app_for(pipeline: ScriptedPipeline | None, **state: Any) -> tuple[Any, ServingState]:
    serving = ServingState(model_name="m", pipeline=pipeline, **state)
    return create_app(serving), serving


# --- bodies that do not arrive ----------------------------------------------------------


def test_a_body_that_stalls_is_408_after_the_body_timeout() -> None:
    pipeline = ScriptedPipeline()
    app, state = app_for(pipeline, limits=Limits(body_timeout_s=0.05))
    exchange = Exchange("/v1/chat/completions", [CHAT[:5]], then="stall")
    started = time.perf_counter()
    asyncio.run(exchange.run(app))
    assert time.perf_counter() - started < 2
    assert exchange.status == 408
    error = json.loads(exchange.body)["error"]
    assert error["code"] == "request_timeout" and error["param"] == "body"
    assert "did not arrive within 0.05 s" in error["message"]
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1


def test_a_client_that_leaves_mid_body_gets_a_bare_400_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    pipeline = ScriptedPipeline()
    app, state = app_for(pipeline)
    exchange = Exchange("/v1/chat/completions", [CHAT[:5], CHAT[5:10]], then="leave")
    exchange.incoming[-1]["more_body"] = True  # it said more would come, then left
    with caplog.at_level(logging.INFO, "omnictl.serving"):
        asyncio.run(exchange.run(app))
    assert exchange.status == 400 and exchange.body == b""
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1
    assert [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()] == [
        "the client disconnected before sending its whole request body"]


def test_a_length_that_is_not_a_number_is_not_trusted_the_bytes_are_counted() -> None:
    app, _ = app_for(ScriptedPipeline(), limits=Limits(max_body_bytes=20))
    exchange = Exchange("/v1/chat/completions", [CHAT[:15], CHAT[15:]], headers={"content-length": "1e3"})
    asyncio.run(exchange.run(app))
    assert exchange.status == 413
    assert json.loads(exchange.body)["error"]["message"] == "request body exceeds the limit of 20 bytes"
    small, _ = app_for(ScriptedPipeline(), limits=Limits(max_body_bytes=len(CHAT)))
    fits = Exchange("/v1/chat/completions", [CHAT[:15], CHAT[15:]], headers={"content-length": str(len(CHAT))})
    asyncio.run(fits.run(small))
    assert fits.status == 200


def test_while_starting_a_request_is_503_after_its_body_is_read() -> None:
    app, state = app_for(None)
    exchange = Exchange("/v1/chat/completions", [CHAT])
    asyncio.run(exchange.run(app))
    assert exchange.status == 503 and json.loads(exchange.body)["error"]["code"] == "starting"


# --- clients that leave while their answer is made ----------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/v1/chat/completions", CHAT, "application/json"),  # answered whole: results() waits
        ("/v1/audio/speech", SPEECH, "application/json"),  # first_item() waits for the first audio
    ],
)
def test_a_client_that_leaves_before_any_output_aborts_its_request(path: str, body: bytes, content_type: str) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    app, state = app_for(pipeline)
    exchange = Exchange(path, [body], then="leave", content_type=content_type)
    asyncio.run(exchange.run(app))
    assert exchange.status == 499
    assert pipeline.aborts == list(pipeline.requests) and len(pipeline.aborts) == 1
    assert state.metrics.count("aborted") == 1 and state.active == {}


def multipart(fields: dict[str, str], wav: bytes) -> tuple[bytes, str]:
    boundary = "omnictlboundary"
    out = b""
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    out += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n").encode() + wav + f"\r\n--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("stream", ["true", "false"])
def test_a_transcription_client_that_leaves_aborts_its_request(stream: str) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    app, state = app_for(pipeline)
    body, content_type = multipart({"stream": stream}, wav_bytes(tone(0.1)))
    exchange = Exchange("/v1/audio/transcriptions", [body], then="leave", content_type=content_type)
    asyncio.run(exchange.run(app))
    assert exchange.status == 499
    assert len(pipeline.aborts) == 1 and state.metrics.count("aborted") == 1 and state.active == {}


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                            "stream": True}).encode()),
                       ("/v1/audio/speech", SPEECH)],
)
def test_a_client_that_leaves_mid_stream_aborts_its_request(path: str, body: bytes) -> None:
    first = text_events(["a"])[:1] if "chat" in path else audio_events(1)[:1]
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: first, hold=True)
    app, state = app_for(pipeline)
    exchange = Exchange(path, [body])

    async def leave_after_the_first_chunk() -> None:
        task = asyncio.ensure_future(exchange.run(app))
        while not any(m["type"] == "http.response.body" and m.get("body") for m in exchange.sent):
            await asyncio.sleep(0.001)
        exchange.incoming.append({"type": "http.disconnect"})
        exchange.then = "leave"
        exchange.done.set()  # the blocked receive returns the disconnect
        await task

    asyncio.run(leave_after_the_first_chunk())
    assert exchange.status == 200
    assert pipeline.aborts == list(pipeline.requests) and len(pipeline.aborts) == 1
    assert state.metrics.count("aborted") == 1 and state.active == {}


# --- a stream whose production raises -----------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/audio/speech"])
def test_a_stream_that_raises_is_ended_once_with_an_error_and_the_request_freed(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    broken = AudioChunk(tone(0.01), 16_000)
    broken.samples = np.array(["not", "samples"])  # past the output contract's check: the encoder cannot read it
    script = [RequestEvent(RequestEventKind.STREAM, "speak", broken)]
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: script)
    client = TestClient(create_app(state := ServingState(model_name="m", pipeline=pipeline)), base_url="http://localhost")
    if "chat" in path:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                "modalities": ["audio"], "audio": {"format": "pcm16"}}
    else:
        body = {"input": "Hello.", "response_format": "pcm", "stream_format": "sse"}
    with caplog.at_level(logging.WARNING):
        response = client.post(path, json=body, headers={"X-Request-Id": "r-broken"})
    assert response.status_code == 200
    closing = json.loads(response.text.split("data: ")[-2 if "chat" in path else -1])
    message = "the server failed to send the response" if "chat" in path else "the server failed to send the audio"
    assert closing == {"error": {"message": message, "type": "server_error", "code": "internal_error", "param": None}}
    if "chat" in path:
        assert response.text.endswith("data: [DONE]\n\n")
    assert pipeline.aborts == ["r-broken"]
    assert state.metrics.count("failed") == 1 and state.active == {}
    [line] = [r for r in caplog.records if "r-broken" in r.getMessage()]  # once: not again as a failure
    assert line.exc_info is not None and line.exc_info[0] is not None and line.levelno == logging.ERROR
    assert line.getMessage() == f"request r-broken failed: producing its stream raised {line.exc_info[0].__name__}"
    assert line.request_id == "r-broken"  # type: ignore[attr-defined]


# --- admission by continuity --------------------------------------------------------------


def test_a_new_audio_request_that_would_make_a_stream_underrun_is_429() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(1))
    app, state = app_for(pipeline, max_underrun_ms=100.0)
    behind_stream(state)
    client = TestClient(app, base_url="http://localhost")
    response = client.post("/v1/audio/speech", json={"input": "Hi", "response_format": "pcm"})
    assert response.status_code == 429 and response.headers["Retry-After"] == "4"
    error = response.json()["error"]
    assert error["code"] == "audio_underrun" and error["type"] == "rate_limit_error"
    assert "one of the 1 playing underrun by 7900 ms (--max-underrun-ms 100)" in error["message"]
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1
    assert 'omnictl_admission_rejections_total{reason="underrun"} 1.0' in state.metrics.exposition().decode()
    # text needs no playback: it is admitted
    assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200


def test_underrun_admission_is_off_without_the_limit_and_ignores_finished_streams() -> None:
    for max_underrun_ms, outcome in ((None, None), (100.0, "completed"), (8000.0, None)):
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(1))
        app, state = app_for(pipeline, max_underrun_ms=max_underrun_ms)
        behind_stream(state, outcome)
        client = TestClient(app, base_url="http://localhost")
        assert client.post("/v1/audio/speech", json={"input": "Hi", "response_format": "pcm"}).status_code == 200


# --- one request's tracking -----------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[EventKind, str, dict[str, Any]]] = []

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: Any) -> None:
        self.records.append((kind, request_id, meta))


def test_a_gap_in_a_streams_audio_is_recorded_on_its_timeline() -> None:
    state = ServingState(model_name="m")
    tracked = Tracked(ScriptedRequest("r-1", [], False), state.metrics, state.active, "m")
    tracked.profiler = recorder = Recorder()
    tracked.plays("/v1/audio/speech")
    tracked.saw(AudioChunk(tone(0.001), 16_000))
    time.sleep(0.02)
    tracked.saw(AudioChunk(tone(0.001), 16_000))
    [(kind, request_id, meta)] = recorder.records
    assert kind is EventKind.UNDERRUN and request_id == "r-1"
    assert meta["chunk"] == 1 and meta["endpoint"] == "/v1/audio/speech" and 0.01 < meta["seconds"] < 1
    assert tracked.first_audio is not None and 0 < tracked.first_audio < 5 and tracked.first_text is None
    tracked.saw_text()
    assert tracked.first_text is not None and tracked.first_audio <= tracked.first_text < 5


def test_one_outcome_per_request_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    state = ServingState(model_name="m")
    state.metrics.in_flight.inc()
    tracked = Tracked(ScriptedRequest("r-2", [], False), state.metrics, state.active, "m")
    state.active["r-2"] = tracked
    with caplog.at_level(logging.WARNING):
        tracked.finish("failed")
        tracked.finish("completed")  # a second outcome is ignored
    assert tracked.outcome == "failed" and state.active == {}
    assert state.metrics.count("failed") == 1 and state.metrics.count("completed") == 0
    [line] = caplog.records
    assert line.getMessage() == "request r-2 failed: (no reason given)" and line.request_id == "r-2"  # type: ignore[attr-defined]
    exposition = state.metrics.exposition().decode()
    assert "omnictl_requests_in_flight 0.0" in exposition and "omnictl_request_latency_seconds_count 0.0" in exposition
    caplog.clear()
    quiet = Tracked(ScriptedRequest("r-3", [], False), state.metrics, state.active, "m")
    quiet.finish("failed", "why", logged=True)  # logged where it happened
    assert caplog.records == []


# --- liveness --------------------------------------------------------------------------


def test_the_liveness_watch_marks_processes_that_do_not_answer() -> None:
    pipeline = ScriptedPipeline()
    from types import SimpleNamespace

    pipeline.topology = SimpleNamespace(processes={"heads": SimpleNamespace(instances=["heads"])})
    pipeline.stage_stats = {"answer": {"status": "unknown", "process": "heads"}}
    state = ServingState(model_name="m", pipeline=pipeline)

    async def watch_twice() -> None:
        task = asyncio.ensure_future(watch_liveness(state, every_s=0.01))
        while len(pipeline.avoided) < 2:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(watch_twice())
    assert state.unresponsive == ["heads"] and pipeline.avoided[0] == ["heads"]
    assert LIVENESS_EVERY_S == 1.0


def test_a_request_id_is_kept_when_well_formed_and_replaced_otherwise() -> None:
    client = TestClient(create_app(ServingState(model_name="m", pipeline=ScriptedPipeline())), base_url="http://localhost")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    kept = client.post("/v1/chat/completions", json=chat, headers={"X-Request-Id": "a.B_c:1-" + "z" * 120})
    assert kept.headers["x-request-id"] == "a.B_c:1-" + "z" * 120
    fresh = client.post("/v1/chat/completions", json=chat)
    assert fresh.headers["x-request-id"].startswith("chatcmpl-") and len(fresh.headers["x-request-id"]) == 33
    for bad in ("x" * 129, "sp ace", "a/b"):
        response = client.post("/v1/chat/completions", json=chat, headers={"X-Request-Id": bad})
        assert response.status_code == 400 and response.headers["x-request-id"].startswith("chatcmpl-")
        assert response.json()["error"]["param"] == "X-Request-Id"
    assert client.get("/health").headers["x-request-id"].startswith("chatcmpl-")  # every route, not only the API
