"""Aborts over HTTP, checked where they land: a client that leaves a speech or a
transcription, and a realtime response cancelled or talked over, make each stage still
working on the request record that it dropped it (``stage_aborted`` in the run's trace),
within a fifth of what the work would take. Waiting for the server to go idle would pass
even if no abort were sent: the slow stages end on their own after :data:`WORK_S`.

One real ``omnictl serve`` of ``slow.yaml`` (plain-function stages in two processes)
for the module; the trace is read from its run directory."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.sync.client import connect

from benchmarks.eval.samples import wav_bytes
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.store import TraceStore
from tests.serving.fast_stages import RATE, tone
from tests.serving.harness import API_KEY, HERE, ServerProcess, start_server, stop_server
from tests.serving.realtime.speech import chunks, sample, silence
from tests.serving.slow_stages import AUDIO_S, WORK_S

TOPOLOGY = HERE / "slow.yaml"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
BOUND_S = WORK_S / 5  # an abort lands within this; the work would run for WORK_S
SLOW = "please answer this slowly"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("abort-run")


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[ServerProcess]:
    running = start_server(str(TOPOLOGY), "--api-key", API_KEY, "--run-dir", str(run_dir))
    yield running
    assert stop_server(running) == 0, running.text()


def events_of(run_dir: Path, request_id: str) -> list[Event]:
    return TraceStore(run_dir).events(request_id)


def wait_for_event(run_dir: Path, request_id: str, kind: EventKind, stages: set[str], timeout: float = 20.0) -> list[Event]:
    """The request's events once ``kind`` is recorded at every one of ``stages`` (stages
    send their records to the collector in batches: poll the store)."""
    deadline = time.monotonic() + timeout
    while True:
        events = events_of(run_dir, request_id)
        if stages <= {e.stage for e in events if e.kind is kind}:
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"{request_id}: no {kind.value} at {sorted(stages)} within {timeout}s: "
                                 f"{[(e.kind.value, e.stage) for e in events]}")
        time.sleep(0.05)


def assert_dropped_promptly(run_dir: Path, request_id: str, holding: set[str], left_at: float) -> None:
    """Every stage in ``holding`` records ``stage_aborted`` within BOUND_S of ``left_at``
    and none of them finished the work; no other stage records it (they were done with it)."""
    events = wait_for_event(run_dir, request_id, EventKind.STAGE_ABORTED, holding)
    time.sleep(0.3)  # a stray record from a stage that was done with it would come with the same batch
    events = events_of(run_dir, request_id)
    dropped = {e.stage: e.ts / 1e9 for e in events if e.kind is EventKind.STAGE_ABORTED}
    assert set(dropped) == holding, sorted((e.kind.value, e.stage) for e in events)
    for stage, at in dropped.items():
        assert at - left_at < BOUND_S, (stage, at - left_at)  # the abort, not the work's end
    finished = [e.stage for e in events if e.kind is EventKind.STAGE_DONE and e.stage in holding]
    assert finished == [], finished


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_client_leaving_a_speech_mid_stream_aborts_it_at_the_speaking_stage(
        server: ServerProcess, run_dir: Path, stream_format: str) -> None:
    request_id = f"speech-{stream_format}-{uuid.uuid4().hex[:8]}"
    body = {"model": "slow", "input": SLOW, "response_format": "pcm", "stream_format": stream_format}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=30,
                      headers={**HEADERS, "X-Request-Id": request_id}) as response:
        assert response.status_code == 200, response.read()
        assert next(response.iter_bytes())  # the first audio: `speak` is working on it
        left_at = time.time()
    assert_dropped_promptly(run_dir, request_id, {"speak"}, left_at)


def _chat(stream: bool) -> dict[str, Any]:
    return {"model": "slow", "messages": [{"role": "user", "content": SLOW}], "stream": stream,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}


def test_a_client_leaving_a_streamed_chat_aborts_it_at_both_terminals(server: ServerProcess, run_dir: Path) -> None:
    request_id = f"chat-stream-{uuid.uuid4().hex[:8]}"
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=_chat(stream=True), timeout=30,
                      headers={**HEADERS, "X-Request-Id": request_id}) as response:
        assert response.status_code == 200, response.read()
        begun: set[str] = set()
        for line in response.iter_lines():  # until the text and the audio have both begun
            choices = json.loads(line[6:]).get("choices") if line.startswith("data: {") else None
            begun |= set(choices[0]["delta"]) & {"content", "audio"} if choices else set()
            if begun == {"content", "audio"}:
                break
        left_at = time.time()
    assert_dropped_promptly(run_dir, request_id, {"answer", "speak"}, left_at)


def test_a_client_leaving_a_chat_it_waits_for_aborts_it_at_both_terminals(server: ServerProcess, run_dir: Path) -> None:
    request_id = f"chat-{uuid.uuid4().hex[:8]}"
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(_chat(stream=False)),
                       headers={**HEADERS, "X-Request-Id": request_id, "Content-Type": "application/json"})
    wait_for_event(run_dir, request_id, EventKind.FIRST_EMIT, {"answer", "speak"})  # both are on it
    connection.close()
    left_at = time.time()
    assert_dropped_promptly(run_dir, request_id, {"answer", "speak"}, left_at)


def _transcription_form(seconds: float, stream: bool) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    audio = wav_bytes(tone(seconds), RATE)
    fields = [("model", "slow"), ("stream", "true" if stream else "false")]
    body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields)
    body += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
             "Content-Type: audio/wav\r\n\r\n").encode() + audio + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_a_client_leaving_a_transcription_it_waits_for_aborts_it_at_the_recognizer(
        server: ServerProcess, run_dir: Path) -> None:
    request_id = f"transcribe-{uuid.uuid4().hex[:8]}"
    body, content_type = _transcription_form(AUDIO_S, stream=False)
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    connection.request("POST", "/v1/audio/transcriptions", body=body,
                       headers={**HEADERS, "X-Request-Id": request_id, "Content-Type": content_type})
    wait_for_event(run_dir, request_id, EventKind.FIRST_EMIT, {"hear"})  # its first segment: `hear` is on it
    connection.close()  # the client gives up waiting for the whole transcript
    left_at = time.time()
    assert_dropped_promptly(run_dir, request_id, {"hear"}, left_at)


def test_a_client_leaving_a_streamed_transcription_aborts_it_at_the_recognizer(
        server: ServerProcess, run_dir: Path) -> None:
    request_id = f"transcribe-stream-{uuid.uuid4().hex[:8]}"
    body, content_type = _transcription_form(AUDIO_S, stream=True)
    headers = {**HEADERS, "X-Request-Id": request_id, "Content-Type": content_type}
    with httpx.stream("POST", server.url + "/v1/audio/transcriptions", content=body, headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200, response.read()
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["type"] == "transcript.text.delta"
        left_at = time.time()
    assert_dropped_promptly(run_dir, request_id, {"hear"}, left_at)


@contextlib.contextmanager
def _realtime(server: ServerProcess, turn_detection: Any) -> Iterator[Any]:
    """A realtime session answering in text and audio, with ``turn_detection``."""
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=slow"
    with connect(url, additional_headers=HEADERS, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text", "audio"],
            "audio": {"input": {"turn_detection": turn_detection}}}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        yield ws


def _answering(ws: Any) -> None:
    """Ask for a slow answer and return once both terminals are streaming it."""
    ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": SLOW}]}}))
    ws.send(json.dumps({"type": "response.create"}))
    waiting = {"response.output_text.delta", "response.output_audio.delta"}
    while waiting:
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] not in ("response.done", "error"), event
        waiting.discard(event["type"])


def _until(ws: Any, kind: str) -> dict[str, Any]:
    for _ in range(5000):
        event = json.loads(ws.recv(timeout=30))
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind} event")


def _responses(run_dir: Path) -> set[str]:
    """The pipeline requests of realtime responses the trace has seen (their ids are the server's)."""
    return {e.request_id for e in TraceStore(run_dir).iter_events() if e.request_id.startswith("resp_req_")}


def _the_new_response(run_dir: Path, before: set[str]) -> str:
    new = _responses(run_dir) - before
    assert len(new) == 1, new
    return new.pop()


def test_a_realtime_response_cancel_aborts_it_at_both_terminals(server: ServerProcess, run_dir: Path) -> None:
    before = _responses(run_dir)
    with _realtime(server, None) as ws:
        _answering(ws)
        ws.send(json.dumps({"type": "response.cancel"}))
        left_at = time.time()
        done = _until(ws, "response.done")["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert_dropped_promptly(run_dir, _the_new_response(run_dir, before), {"answer", "speak"}, left_at)


def test_speech_over_a_realtime_answer_aborts_it_at_both_terminals(server: ServerProcess, run_dir: Path) -> None:
    before = _responses(run_dir)
    with _realtime(server, {"type": "server_vad", "create_response": False}) as ws:
        _answering(ws)
        talking_from = time.time()
        for audio in chunks(sample("sky_colour") + silence(800)):  # the user talks over the answer
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        done = _until(ws, "response.done")["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
        # from the first word sent: the voice detector's own delay is inside the bound
        assert_dropped_promptly(run_dir, _the_new_response(run_dir, before), {"answer", "speak"}, talking_from)
