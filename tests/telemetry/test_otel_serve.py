"""OpenTelemetry end to end: a real `omnictl serve --otlp-endpoint` exports every finished
request to a real OTLP/HTTP receiver in this test; a caller's `traceparent` (chat, speech,
transcriptions, and a realtime session's handshake) makes the request a child of its span."""

from __future__ import annotations

import os
import socket
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator
from unittest import mock

import httpx
import openai
import pytest

from benchmarks.eval.samples import wav_bytes
from tests.serving.fast_stages import tone
from tests.serving.harness import API_KEY, ServerProcess, start_server, stop_server, wait_until
from tests.serving.realtime.speech import collect_until_done
from tests.support.otlp import OtlpReceiver, ReceivedSpan

TOPOLOGY = os.path.join(os.path.dirname(__file__), "otel.yaml")
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def server(receiver: OtlpReceiver) -> Iterator[ServerProcess]:
    # The variable names a dead endpoint: the flag must win over it.
    with mock.patch.dict(os.environ, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}):
        running = start_server(TOPOLOGY, "--api-key", API_KEY, "--otlp-endpoint", receiver.url)
    yield running
    assert stop_server(running) == 0, running.text()


def caller() -> tuple[str, str, str]:
    """A caller's trace id, span id and its traceparent header (sampled)."""
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def trace_of(receiver: OtlpReceiver, request_id: str) -> list[ReceivedSpan]:
    """The request's spans once its root and its stages' phase spans have all arrived."""
    def complete() -> list[ReceivedSpan]:
        spans = receiver.of_request(request_id)
        stages = {s.name for s in spans if s.name.startswith("stage ")}
        return spans if stages and all(any(c.parent_span_id == s.span_id for c in spans)
                                       for s in spans if s.name.startswith("stage ")) else []
    return receiver.wait_for(complete)


def check_links(spans: list[ReceivedSpan]) -> ReceivedSpan:
    """Stage spans' parent is the root; every other span's parent is its stage's span.
    Returns the root."""
    roots = [s for s in spans if s.name == "omnictl.request"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    stages = {s.attributes["omnictl.stage"]: s for s in spans if s.name.startswith("stage ")}
    assert stages and all(s.parent_span_id == root.span_id for s in stages.values())
    for span in spans:
        if span is root or span.name.startswith("stage "):
            continue
        assert span.parent_span_id == stages[span.attributes["omnictl.stage"]].span_id, span
        assert span.trace_id == root.trace_id
    assert len({s.span_id for s in spans}) == len(spans)
    return root


# The requests of the tests on the shared server, sent all at once by the fixture `sent`: a
# request's spans reach the receiver a second or two after it ends (the exporter's grace for
# late events, then its batch delay), so the tests wait for theirs together, not one by one.
def send_chat(server: ServerProcess) -> tuple[tuple[str, str], httpx.Response]:
    trace_id, span_id, traceparent = caller()
    response = httpx.post(server.url + "/v1/chat/completions", headers={**HEADERS, "traceparent": traceparent},
                          json={"messages": [{"role": "user", "content": "hello there"}], "modalities": ["text", "audio"],
                                "audio": {"format": "wav"}}, timeout=30)
    return (trace_id, span_id), response


def send_speech_and_transcription(server: ServerProcess) -> tuple[tuple[str, str], httpx.Response, httpx.Response]:
    trace_id, span_id, traceparent = caller()
    speech = httpx.post(server.url + "/v1/audio/speech", headers={**HEADERS, "traceparent": traceparent},
                        json={"model": "otel", "input": "say this", "voice": "alloy"}, timeout=30)
    wav = wav_bytes(tone(0.25), 16_000)
    heard = httpx.post(server.url + "/v1/audio/transcriptions", headers={**HEADERS, "traceparent": traceparent},
                       files={"file": ("q.wav", wav, "audio/wav")}, data={"model": "otel"}, timeout=30)
    return (trace_id, span_id), speech, heard


def send_realtime(server: ServerProcess) -> tuple[str, str]:
    trace_id, span_id, traceparent = caller()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with client.realtime.connect(model="otel", extra_headers={"traceparent": traceparent}) as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "audio": {"input": {"turn_detection": None}}})
        assert connection.recv().type == "session.updated"
        for text in ("first question", "second question"):
            connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
            connection.response.create()
            assert collect_until_done(connection)[-1].response.status == "completed"
    return trace_id, span_id


def send_malformed_traceparent(server: ServerProcess) -> httpx.Response:
    bad = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"  # an all-zero trace id is invalid
    return httpx.post(server.url + "/v1/chat/completions", headers={**HEADERS, "traceparent": bad},
                      json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)


def send_failing(server: ServerProcess) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", headers=HEADERS,
                      json={"messages": [{"role": "user", "content": "please explode"}]}, timeout=30)


SENDERS: dict[str, Callable[[ServerProcess], Any]] = {
    "chat": send_chat, "speech": send_speech_and_transcription, "realtime": send_realtime,
    "malformed": send_malformed_traceparent, "failing": send_failing,
}


@pytest.fixture(scope="module")
def sent(server: ServerProcess) -> dict[str, Future[Any]]:
    """Each sender's outcome (``.result()`` raises what it raised), all sent at once."""
    with ThreadPoolExecutor(len(SENDERS)) as pool:
        futures = {name: pool.submit(send, server) for name, send in SENDERS.items()}
        wait(futures.values())
    return futures


def test_a_chat_request_is_one_trace_under_the_callers_span(sent: dict[str, Future[Any]], receiver: OtlpReceiver) -> None:
    (trace_id, span_id), response = sent["chat"].result()
    assert response.status_code == 200, response.text
    spans = trace_of(receiver, response.headers["x-request-id"])
    root = check_links(spans)
    assert (root.trace_id, root.parent_span_id) == (trace_id, span_id)
    assert root.attributes["omnictl.outcome"] == "completed"
    assert root.attributes["omnictl.modalities"] == ["audio", "text"]
    assert root.resource["service.name"] == "omnictl" and root.resource["omnictl.model"] == "otel"
    names = {s.name for s in spans}
    assert {n for n in names if n.startswith("stage ")} == {"stage front", "stage answer", "stage speak"}
    assert {"queue", "build"} <= names  # waiting and computing at a stage
    hops = [s for s in spans if s.name.startswith("hop ")]
    assert {h.name for h in hops} == {"hop front → answer", "hop front → speak"}
    # Between processes: shared memory, with the bytes sent.
    assert all(h.attributes["omnictl.transport"] == "shm" and h.attributes["omnictl.bytes"] > 0 for h in hops)
    # Every span has its real times, inside the request's.
    assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in spans)
    assert "first_text" in {e[0] for e in root.events} and "first_audio" in {e[0] for e in root.events}


def test_speech_and_transcriptions_follow_the_callers_span(sent: dict[str, Future[Any]], receiver: OtlpReceiver) -> None:
    (trace_id, span_id), speech, heard = sent["speech"].result()
    assert speech.status_code == 200, speech.text
    assert heard.status_code == 200 and heard.json()["text"] == "4000 samples", heard.text
    for response, stages in ((speech, {"stage front", "stage speak"}), (heard, {"stage front", "stage hear"})):
        spans = trace_of(receiver, response.headers["x-request-id"])
        root = check_links(spans)
        assert (root.trace_id, root.parent_span_id) == (trace_id, span_id)
        assert {s.name for s in spans if s.name.startswith("stage ")} == stages  # pruned to what it ran
    hop = next(s for s in trace_of(receiver, heard.headers["x-request-id"]) if s.name.startswith("hop "))
    assert hop.name == "hop front → hear" and hop.attributes["omnictl.transport"] == "inproc"  # one process


def test_a_realtime_sessions_handshake_parents_every_response(sent: dict[str, Future[Any]],
                                                               receiver: OtlpReceiver) -> None:
    trace_id, span_id = sent["realtime"].result()

    def roots() -> list[ReceivedSpan]:
        found = [s for s in receiver if s.trace_id == trace_id and s.name == "omnictl.request"]
        return found if len(found) == 2 else []

    for root in receiver.wait_for(roots):
        assert root.parent_span_id == span_id
        check_links(trace_of(receiver, root.attributes["omnictl.request_id"]))


def test_a_malformed_traceparent_is_ignored(sent: dict[str, Future[Any]], receiver: OtlpReceiver) -> None:
    response = sent["malformed"].result()
    assert response.status_code == 200, response.text
    root = check_links(trace_of(receiver, response.headers["x-request-id"]))
    assert root.parent_span_id == "" and root.trace_id != "0" * 32  # a trace of its own


def test_a_failed_request_is_an_error_on_its_root_and_its_stage(sent: dict[str, Future[Any]],
                                                                 receiver: OtlpReceiver) -> None:
    response = sent["failing"].result()
    assert response.status_code >= 500, response.text
    spans = trace_of(receiver, response.headers["x-request-id"])
    root = check_links(spans)
    assert root.status_code == 2 and root.attributes["omnictl.outcome"] == "failed"
    assert "front exploded on purpose" in root.attributes["omnictl.error"]
    assert root.attributes["omnictl.failed_stage"] == "front"
    assert next(s for s in spans if s.name == "stage front").status_code == 2


def test_stopping_the_server_flushes_what_has_ended(receiver: OtlpReceiver) -> None:
    running = start_server(TOPOLOGY, "--api-key", API_KEY, "--otlp-endpoint", receiver.url)
    try:
        response = httpx.post(running.url + "/v1/chat/completions", headers=HEADERS,
                              json={"messages": [{"role": "user", "content": "last words"}]}, timeout=30)
        assert response.status_code == 200, response.text
    finally:
        code = stop_server(running)  # at once: within the second the trace would wait for late events
    assert code == 0, running.text()
    spans = receiver.of_request(response.headers["x-request-id"])  # no waiting: there when serve has exited
    assert {s.name for s in spans} >= {"omnictl.request", "stage front", "stage answer"}


def test_an_unreachable_endpoint_is_one_warning_and_serving_goes_on() -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    with mock.patch.dict(os.environ, {"OTEL_EXPORTER_OTLP_ENDPOINT": dead}):  # the variable alone turns it on
        running = start_server(TOPOLOGY, "--api-key", API_KEY)
    try:
        wait_until(lambda: f"goes to {dead}/v1/traces" in running.text())  # printed just after "listening on"
        for round_ in range(2):  # two batches at least: one second apart
            for index in range(5):
                response = httpx.post(running.url + "/v1/chat/completions", headers=HEADERS,
                                      json={"messages": [{"role": "user", "content": f"q{round_} {index}"}]}, timeout=30)
                assert response.status_code == 200, response.text
            wait_until(lambda: "cannot export traces" in running.text(), timeout=20)
    finally:
        code = stop_server(running)
    assert code == 0, running.text()
    assert running.text().count("cannot export traces") == 1, running.text()
    assert "Traceback" not in running.text()
