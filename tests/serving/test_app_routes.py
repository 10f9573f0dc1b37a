"""The app's routes in the test process, against a scripted pipeline: the admission checks
every endpoint shares (key, media type, limits, capabilities, model, the pipeline's
refusals), a chat completion answered whole and streamed with its one outcome, abort,
/health, /v1/models and /metrics. Each test is milliseconds: no process, no model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from omnictl.admission import Admission
from omnictl.exceptions import AdmissionTimeout, InvalidRequest, Overloaded, PipelineDead
from omnictl.serving.app import busy_stages, create_app, note_unresponsive, unresponsive_processes
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.state import ServingState
from tests.serving.scripted import (
    CHAT_ONLY,
    ScriptedPipeline,
    audio_events,
    end_in_flight_soon,
    error_event,
    text_events,
)

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def serve(pipeline: ScriptedPipeline | None, **state: Any) -> tuple[TestClient, ServingState]:
    serving = ServingState(model_name="m", pipeline=pipeline, api_key=KEY, **state)
    return TestClient(create_app(serving), base_url="http://localhost"), serving


def error_of(response: Any) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


def error_in(response: Any, stream: bool, status: int) -> dict[str, Any]:
    """The error a request ended with: the first ``error`` event of a stream, else the JSON
    body of a response whose status must be ``status``."""
    if stream:
        event: dict[str, Any] = next(e for e in sse_events(response.text) if isinstance(e, dict) and "error" in e)
        return event["error"]  # type: ignore[no-any-return]
    assert response.status_code == status
    return error_of(response)


def sse_events(text: str) -> list[Any]:
    """The data of each server-sent event ([DONE] as the string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --- admission ---------------------------------------------------------------------------


def test_a_missing_or_wrong_key_is_401_and_counted_rejected() -> None:
    client, state = serve(ScriptedPipeline())
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert response.status_code == 401
        assert error_of(response) == {"message": "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                      "type": "authentication_error", "code": "invalid_api_key", "param": None}
    assert state.metrics.count("rejected") == 2 and state.pipeline.submitted == []  # type: ignore[union-attr]


def test_a_body_that_is_not_json_typed_is_415_naming_what_was_sent() -> None:
    client, state = serve(ScriptedPipeline())
    response = client.post("/v1/chat/completions", content=json.dumps(CHAT), headers={**AUTH, "Content-Type": "text/plain"})
    assert response.status_code == 415
    error = error_of(response)
    assert error["code"] == "unsupported_media_type" and error["param"] == "Content-Type"
    assert "application/json" in error["message"] and "'text/plain'" in error["message"]
    # parameters and case after the type itself do not matter
    ok = client.post("/v1/chat/completions", content=json.dumps(CHAT),
                     headers={**AUTH, "Content-Type": "Application/JSON; charset=utf-8"})
    assert ok.status_code == 200
    none = client.post("/v1/chat/completions", content=b"{}", headers={**AUTH, "Content-Type": ""})
    assert none.status_code == 415 and "'none'" in error_of(none)["message"]
    assert state.metrics.count("rejected") == 2


def test_an_unresponsive_process_is_503_naming_it_before_the_body_is_read() -> None:
    pipeline = ScriptedPipeline()
    client, state = serve(pipeline, unresponsive=["heads", "front"])
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 503 and response.headers["Retry-After"] == "2"
    error = error_of(response)
    assert error == {"message": "stage process 'heads', 'front' is not responding (see /health); retry later",
                     "type": "server_error", "code": "stage_unresponsive", "param": None}
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1


def test_a_full_server_is_429_at_once_with_retry_after() -> None:
    admission = Admission(max_in_flight=1, max_queue_wait=0.0)
    admission.in_flight = 1  # the one slot is taken
    pipeline = ScriptedPipeline(admission=admission)
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    error = error_of(response)
    assert error["code"] == "overloaded" and error["type"] == "rate_limit_error"
    assert "limit of 1 requests" in error["message"] and pipeline.submitted == []
    assert state.metrics.count("rejected") == 1
    assert 'omnictl_admission_rejections_total{reason="over_limit"} 1.0' in state.metrics.exposition().decode()


@pytest.mark.parametrize(
    ("refusal", "status", "code", "reason"),
    [
        (Overloaded("too many", retry_after=3), 429, "overloaded", "over_limit"),
        (AdmissionTimeout("waited too long", retry_after=4), 503, "queue_timeout", "queue_timeout"),
    ],
)
def test_a_refusal_at_submit_is_429_or_503_with_its_retry_after(
    refusal: Overloaded, status: int, code: str, reason: str
) -> None:
    pipeline = ScriptedPipeline()
    pipeline.refuse = refusal
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == status and error_of(response)["code"] == code
    assert response.headers["Retry-After"] == str(refusal.retry_after)
    assert error_of(response)["message"] == str(refusal)
    assert error_of(response)["type"] == ("server_error" if status == 503 else "rate_limit_error")
    assert f'omnictl_admission_rejections_total{{reason="{reason}"}} 1.0' in state.metrics.exposition().decode()
    assert state.metrics.count("rejected") == 1 and state.active == {}


def test_a_body_over_the_limit_is_413_by_its_declared_length_and_by_what_arrives() -> None:
    client, state = serve(ScriptedPipeline(), limits=Limits(max_body_bytes=64))
    big = json.dumps({**CHAT, "pad": "x" * 100}).encode()
    response = client.post("/v1/chat/completions", content=big, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "payload_too_large" and error["param"] == "body"
    assert f"{len(big)} bytes; the limit is 64" in error["message"]

    def chunks() -> Any:  # chunked: no Content-Length, so only the bytes read tell
        yield big[:40]
        yield big[40:]

    streamed = client.post("/v1/chat/completions", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert streamed.status_code == 413 and "exceeds the limit of 64 bytes" in error_of(streamed)["message"]
    exact = json.dumps(CHAT).encode()
    client2, _ = serve(ScriptedPipeline(), limits=Limits(max_body_bytes=len(exact)))
    assert client2.post("/v1/chat/completions", content=exact,
                        headers={**AUTH, "Content-Type": "application/json"}).status_code == 200  # at the limit: fine
    assert state.metrics.count("rejected") == 2


def test_an_endpoint_the_topology_cannot_serve_is_404_saying_why() -> None:
    client, state = serve(ScriptedPipeline(topology=CHAT_ONLY))
    response = client.post("/v1/audio/speech", json={"input": "hello"}, headers=AUTH)
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unsupported_endpoint" and error["type"] == "invalid_request_error"
    assert error["message"] == (
        "topology 'fast' does not serve /v1/audio/speech: its entry stage does not route straight to an audio "
        "terminal (text to speech without an LLM), nor is every terminal an audio one")
    assert state.metrics.count("rejected") == 1


def test_a_model_this_server_does_not_serve_is_404_listing_those_it_does() -> None:
    pipeline = ScriptedPipeline()
    client, state = serve(pipeline, aliases=("alias",))
    response = client.post("/v1/chat/completions", json={**CHAT, "model": "other"}, headers=AUTH)
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'other' does not exist" in error["message"] and "'m', 'alias'" in error["message"]
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1
    for model in ("alias", "m", ""):  # an alias, the name, or none at all are served
        assert client.post("/v1/chat/completions", json={**CHAT, "model": model}, headers=AUTH).status_code == 200
    assert [s[0].sampling for s in pipeline.submitted]  # each submitted once
    assert len(pipeline.submitted) == 3


def test_submit_refusals_map_to_409_400_and_503() -> None:
    pipeline = ScriptedPipeline()
    client, state = serve(pipeline)
    pipeline.refuse = InvalidRequest("seen before", field="request_id")
    duplicate = client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Request-Id": "abc-1"})
    assert duplicate.status_code == 409
    assert error_of(duplicate)["code"] == "duplicate_request_id" and error_of(duplicate)["param"] == "X-Request-Id"
    assert "'abc-1' was already used" in error_of(duplicate)["message"]
    pipeline.refuse = InvalidRequest("'messages[0]' is odd", field="messages[0]")
    bad = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert bad.status_code == 400 and error_of(bad)["param"] == "messages[0]"
    assert error_of(bad)["code"] == "invalid_request"
    pipeline.refuse = PipelineDead("stage 'answer' is gone")
    dead = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert dead.status_code == 503 and error_of(dead)["code"] == "pipeline_dead"
    assert error_of(dead)["message"] == "the pipeline is down: stage 'answer' is gone"
    assert state.metrics.count("rejected") == 3 and state.active == {}
    # the submit got the request id and the stream flag; no traceparent while not tracing
    assert pipeline.submitted[0][2] == "abc-1" and pipeline.submitted[0][3] is None
    assert pipeline.submitted[0][4] is False


def test_a_traceparent_reaches_submit_only_while_tracing() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for tracing, expected in ((True, parent), (False, None)):
        pipeline = ScriptedPipeline()
        client, _ = serve(pipeline, tracing=tracing)
        assert client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "traceparent": parent}).status_code == 200
        assert pipeline.submitted[0][3] == expected


# --- one chat completion, one outcome ----------------------------------------------------


def test_a_whole_answer_is_one_completion_and_the_request_leaves_the_table() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: text_events(["echo:", "hi", "there"]))
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Request-Id": "r-1"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "r-1"
    body = response.json()
    assert body["id"] == "r-1" and body["model"] == "m" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "echo: hi there"
    assert state.active == {} and state.metrics.count("completed") == 1
    assert pipeline.submitted[0][1] == ["text"]
    exposition = state.metrics.exposition().decode()
    assert 'omnictl_requests_total{outcome="completed"} 1.0' in exposition
    assert "omnictl_requests_in_flight 0.0" in exposition
    assert "omnictl_time_to_first_text_seconds_count 1.0" in exposition
    assert "omnictl_request_latency_seconds_count 1.0" in exposition


def test_an_answer_model_named_by_an_alias_is_answered_as_that_alias() -> None:
    client, _ = serve(ScriptedPipeline(), aliases=("alias",))
    response = client.post("/v1/chat/completions", json={**CHAT, "model": "alias"}, headers=AUTH)
    assert response.json()["model"] == "alias"
    unnamed = client.post("/v1/chat/completions", json={"messages": CHAT["messages"]}, headers=AUTH)
    assert unnamed.json()["model"] == "m"


def test_a_streamed_answer_is_role_deltas_finish_and_done() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: text_events(["echo:", "hi"]))
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                           headers={**AUTH, "X-Request-Id": "r-s"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {"r-s"} and {c["model"] for c in chunks} == {"m"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: hi"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert pipeline.submitted[0][4] is True  # streamed to the caller
    assert state.active == {} and state.metrics.count("completed") == 1


def test_a_terminal_that_only_returns_a_result_is_streamed_as_one_delta_beside_one_that_streamed() -> None:
    from omnictl.coordinator.request import RequestEvent, RequestEventKind
    from omnictl.outputs import TextResult

    def script(inputs: Any, modalities: list[str]) -> list[Any]:
        return audio_events(1) + [RequestEvent(RequestEventKind.RESULT, "answer", TextResult("whole answer"))]

    client, _ = serve(ScriptedPipeline(script=script))
    body = {**CHAT, "stream": True, "modalities": ["text", "audio"], "audio": {"format": "pcm16"}}
    chunks = [e for e in sse_events(client.post("/v1/chat/completions", json=body, headers=AUTH).text) if e != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "whole answer"


def test_a_streamed_answer_in_a_compressed_format_ends_with_the_encoders_last_frames() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    client, _ = serve(ScriptedPipeline(script=lambda inputs, modalities: audio_events(4) + text_events(["hi"])))
    body = {**CHAT, "stream": True, "modalities": ["text", "audio"], "audio": {"format": "mp3"}}
    chunks = [e for e in sse_events(client.post("/v1/chat/completions", json=body, headers=AUTH).text) if e != "[DONE]"]
    import base64

    mp3 = b"".join(base64.b64decode(c["choices"][0]["delta"]["audio"]["data"])
                   for c in chunks if c["choices"] and "audio" in c["choices"][0]["delta"])
    samples, rate = decode_audio_file(mp3, "mp3", 60)
    assert samples.size / rate >= 0.2  # without the encoder's tail ~0.1 s would be missing


def test_a_streamed_answer_with_audio_counts_its_first_audio() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2) + text_events(["hi"]))
    client, state = serve(pipeline)
    body = {**CHAT, "stream": True, "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    chunks = [e for e in sse_events(response.text) if e != "[DONE]"]
    audio = [c["choices"][0]["delta"]["audio"] for c in chunks if c["choices"] and "audio" in c["choices"][0]["delta"]]
    assert audio and all(a["data"] for a in audio)
    exposition = state.metrics.exposition().decode()
    assert "omnictl_time_to_first_audio_seconds_count 1.0" in exposition
    assert 'omnictl_audio_streams_total{endpoint="/v1/chat/completions",model="m"} 1.0' in exposition
    assert state.active == {} and state.metrics.count("completed") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_stage_error_is_a_failure_naming_the_stage_once(stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [error_event("boom at step 3", stage="answer")])
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers={**AUTH, "X-Request-Id": "r-9"})
    error = error_in(response, stream, 500)
    if stream:
        assert sse_events(response.text)[-1] == "[DONE]"
    assert error["code"] == "stage_failed" and error["type"] == "server_error"
    assert error["message"] == "stage 'answer': boom at step 3"
    assert state.metrics.count("failed") == 1 and state.active == {}
    [line] = [r for r in caplog.records if "failed" in r.getMessage() and "r-9" in r.getMessage()]
    assert "stage 'answer': boom at step 3" in line.getMessage()


def test_an_error_that_names_its_stage_already_is_not_prefixed_again() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [error_event("stage 'answer' ran out", stage="answer")])
    client, _ = serve(pipeline)
    assert error_of(client.post("/v1/chat/completions", json=CHAT, headers=AUTH))["message"] == "stage 'answer' ran out"
    pipeline.script = lambda inputs, modalities: [error_event("no stage known", stage=None)]
    assert error_of(client.post("/v1/chat/completions", json=CHAT, headers=AUTH))["message"] == "no stage known"


@pytest.mark.parametrize("stream", [False, True])
def test_a_stage_finding_the_input_bad_is_a_rejection_naming_the_field(stream: bool) -> None:
    pipeline = ScriptedPipeline(
        script=lambda inputs, modalities: [error_event("images are not taken", stage="prep", field="messages[0].content[1]")]
    )
    client, state = serve(pipeline)
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    error = error_in(response, stream, 400)
    assert error == {"message": "stage 'prep': images are not taken", "type": "invalid_request_error",
                     "code": "invalid_request", "param": "messages[0].content[1]"}
    assert state.metrics.count("rejected") == 1 and state.metrics.count("failed") == 0 and state.active == {}


@pytest.mark.parametrize("stream", [False, True])
def test_an_aborted_request_is_409_or_an_aborted_event(stream: bool) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: text_events(["a"])[:1], hold=True)
    client, state = serve(pipeline)

    async def abort_soon() -> None:  # the pipeline is told: the request's events end aborted
        import asyncio

        while not pipeline.requests:
            await asyncio.sleep(0.001)
        await pipeline.abort(next(iter(pipeline.requests)))

    with client:
        client.portal.start_task_soon(abort_soon)  # type: ignore[union-attr]
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    error = error_in(response, stream, 409)
    if stream:
        assert sse_events(response.text)[-1] == "[DONE]"
    assert error["code"] == "aborted" and error["message"] == "the request was aborted"
    assert state.metrics.count("aborted") == 1 and state.active == {}


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_server_ends_on_shutdown_is_told_why(stream: bool) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    client, state = serve(pipeline)
    with client:
        client.portal.start_task_soon(end_in_flight_soon(state, pipeline, "the server is shutting down"))  # type: ignore[union-attr]
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    error = error_in(response, stream, 503)
    assert error == {"message": "the server is shutting down", "type": "server_error", "code": "server_shutdown",
                     "param": None}
    assert pipeline.aborts == list(pipeline.requests) and state.active == {}
    assert state.metrics.count("aborted") == 1


# --- abort, health, models, metrics ------------------------------------------------------


def test_the_abort_route_aborts_a_request_in_flight_and_404s_any_other() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    client, state = serve(pipeline)
    assert client.post("/v1/requests/r-1/abort").status_code == 401
    missing = client.post("/v1/requests/r-1/abort", headers=AUTH)
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    assert "'r-1'" in error_of(missing)["message"] and pipeline.aborts == []

    async def abort_through_the_route() -> None:
        import asyncio

        while "r-1" not in state.active:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)

    with client:
        client.portal.start_task_soon(abort_through_the_route)  # type: ignore[union-attr]
        import threading

        answers: list[Any] = []
        waiting = threading.Thread(target=lambda: answers.append(
            client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Request-Id": "r-1"})))
        waiting.start()
        while "r-1" not in state.active:
            threading.Event().wait(0.005)
        aborted = client.post("/v1/requests/r-1/abort", headers=AUTH)
        waiting.join(5)
    assert aborted.status_code == 200 and aborted.json() == {"id": "r-1", "status": "aborting"}
    assert pipeline.aborts == ["r-1"] and answers[0].status_code == 409


def test_the_abort_route_404s_while_starting() -> None:
    client, _ = serve(None)
    assert client.post("/v1/requests/r-1/abort", headers=AUTH).status_code == 404


def test_health_reports_the_pipeline_and_is_503_when_down_or_unresponsive() -> None:
    pipeline = ScriptedPipeline()
    pipeline.stage_stats = {
        "answer": {"status": "up", "process": "heads", "busy_s": 6.5},
        "speak": {"status": "up", "process": "heads", "busy_s": 1.0},
    }
    client, state = serve(pipeline)
    health = client.get("/health", headers=AUTH)  # the details are the key's
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["down"] == [] and body["unresponsive"] == []
    assert body["busy"] == {"answer": 6.5} and body["processes"] == {"heads": 4242}
    scraped = client.get("/metrics", headers=AUTH).text  # a stage stuck in one step shows in /metrics too
    assert 'omnictl_stage_busy_seconds{stage="answer"} 6.5' in scraped
    assert 'omnictl_stage_busy_seconds{stage="speak"} 1.0' in scraped
    assert body["in_flight"] == 0 and body["pipeline_in_flight"] == 0 and body["run_dir"] is None
    assert body["stages"] == pipeline.stage_stats and body["nodes"] == {"-": {"status": "up"}}

    pipeline.health_status = ("degraded", {"heads#1": "exited"})
    degraded = client.get("/health", headers=AUTH)
    assert degraded.status_code == 200 and degraded.json()["replicas_down"] == {"heads#1": "exited"}

    pipeline.stage_stats = {"answer": {"status": "unknown", "process": "heads"}}
    frozen = client.get("/health", headers=AUTH)
    assert frozen.status_code == 503 and frozen.json()["status"] == "unresponsive"
    assert frozen.json()["unresponsive"] == ["heads"] and pipeline.avoided[-1] == ["heads"]

    pipeline.stage_stats = {"answer": {"status": "down", "process": "heads"}}
    pipeline.health_status = ("down", {})
    down = client.get("/health", headers=AUTH)
    assert down.status_code == 503 and down.json()["status"] == "down" and down.json()["down"] == ["answer"]
    assert state.unresponsive == []


def test_health_without_the_key_says_only_ok_or_not_ok() -> None:
    """Issue 40 bug 8: a caller without the key learned every stage process's PID and the
    run directory's path. It gets the verdict (status code and status) and nothing more."""
    pipeline = ScriptedPipeline()
    pipeline.stage_stats = {"answer": {"status": "up", "process": "heads"}}
    client, _ = serve(pipeline)
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        ok = client.get("/health", headers=headers)
        assert ok.status_code == 200 and ok.json() == {"status": "ok"}
    pipeline.stage_stats = {"answer": {"status": "down", "process": "heads"}}
    pipeline.health_status = ("down", {})
    down = client.get("/health")
    assert down.status_code == 503 and down.json() == {"status": "down"}
    pipeline.stage_stats = {"answer": {"status": "unknown", "process": "heads"}}
    pipeline.health_status = ("ok", {})
    frozen = client.get("/health")
    assert frozen.status_code == 503 and frozen.json() == {"status": "unresponsive"}
    assert "processes" in client.get("/health", headers=AUTH).json()  # with the key: the details


def test_models_lists_the_name_and_aliases_with_their_endpoints() -> None:
    client, state = serve(ScriptedPipeline(topology=CHAT_ONLY), aliases=("a1",))
    assert client.get("/v1/models").status_code == 401
    data = client.get("/v1/models", headers=AUTH).json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["m", "a1"]
    for model in data["data"]:
        assert model["object"] == "model" and model["owned_by"] == "omnictl" and model["created"] == state.created
        assert model["endpoints"] == ["/v1/chat/completions", "/v1/realtime"]
    starting, _ = serve(None)
    [model] = starting.get("/v1/models", headers=AUTH).json()["data"]
    assert "endpoints" not in model


def test_metrics_are_behind_the_key_and_show_the_queue_depth() -> None:
    client, state = serve(ScriptedPipeline())
    assert client.get("/metrics").status_code == 401
    client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    response = client.get("/metrics", headers=AUTH)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert 'omnictl_requests_total{outcome="completed"} 1.0' in response.text
    assert "omnictl_admission_queue_depth 0.0" in response.text


# --- the liveness helpers ---------------------------------------------------------------


def test_unresponsive_processes_names_replicas_or_processes_that_did_not_answer() -> None:
    stages = {
        "a": {"status": "unknown", "process": "p1"},
        "b": {"status": "up", "process": "p2"},
        "c": {"replicas": {"tts#0": {"status": "up"}, "tts#1": {"status": "unknown"}}, "status": "unknown",
              "process": "tts"},
        "d": {"status": "unknown", "process": "p1"},
    }
    assert unresponsive_processes(stages) == ["p1", "tts#1"]
    assert unresponsive_processes({}) == []


def test_busy_stages_are_those_at_or_over_the_threshold() -> None:
    stages = {"a": {"busy_s": 5.0}, "b": {"busy_s": 4.99}, "c": {}, "d": {"busy_s": 12.0}}
    assert busy_stages(stages) == {"a": 5.0, "d": 12.0}
    assert busy_stages(stages, threshold=13.0) == {}


def test_note_unresponsive_keeps_only_processes_with_no_replica_answering() -> None:
    from types import SimpleNamespace

    pipeline = ScriptedPipeline()
    processes = {
        "heads": SimpleNamespace(instances=["heads#0", "heads#1"]),
        "front": SimpleNamespace(instances=["front"]),
        "idle": SimpleNamespace(instances=[]),
    }
    pipeline.topology = SimpleNamespace(processes=processes)
    state = ServingState(model_name="m", pipeline=pipeline)
    note_unresponsive(state, pipeline, ["heads#0", "front"])
    assert state.unresponsive == ["front"] and pipeline.avoided == [["heads#0", "front"]]
    note_unresponsive(state, pipeline, ["heads#0", "heads#1", "front"])
    assert state.unresponsive == ["front", "heads"]
    note_unresponsive(state, pipeline, [])
    assert state.unresponsive == []


# --- the request id middleware ------------------------------------------------------------


def test_the_request_id_replaces_any_the_app_set_whatever_its_case() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from omnictl.serving.app import RequestIdMiddleware

    async def own_id(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"X-Request-ID": "the-app-s", "X-Other": "kept"})

    client = TestClient(RequestIdMiddleware(Starlette(routes=[Route("/", own_id)])))
    response = client.get("/", headers={"X-Request-Id": "r-42"})
    ids = [value for name, value in response.headers.raw if name.lower() == b"x-request-id"]
    assert ids == [b"r-42"]  # one header, the request's
    assert response.headers["x-other"] == "kept" and response.text == "ok"
    fresh = client.get("/")
    [generated] = [value for name, value in fresh.headers.raw if name.lower() == b"x-request-id"]
    assert generated != b"the-app-s" and len(generated) >= 8


def test_the_request_id_middleware_lets_other_scopes_through_untouched() -> None:
    from omnictl.serving.app import RequestIdMiddleware

    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)

    import asyncio

    scope = {"type": "lifespan"}
    asyncio.run(RequestIdMiddleware(app)(scope, None, None))  # type: ignore[arg-type]
    assert seen == [{"type": "lifespan"}]  # no state added, no id


def test_the_server_s_own_refusals_are_whole_errors_of_the_right_type() -> None:
    starting = serve(None)[0].post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert starting.status_code == 503
    assert error_of(starting) == {"message": "the pipeline is still starting; retry shortly", "type": "server_error",
                                  "code": "starting", "param": None}
    pipeline = ScriptedPipeline()
    client, _ = serve(pipeline)
    pipeline.refuse = PipelineDead("stage 'answer' is gone")
    dead = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert error_of(dead) == {"message": "the pipeline is down: stage 'answer' is gone", "type": "server_error",
                              "code": "pipeline_dead", "param": None}
    pipeline.refuse = None
    bad_id = client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Request-Id": "has spaces"})
    assert bad_id.status_code == 400
    assert error_of(bad_id) == {"message": "X-Request-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -",
                                "type": "invalid_request_error", "code": "invalid_request", "param": "X-Request-Id"}


def test_a_json_body_is_recognised_whatever_the_header_s_case_and_parameters() -> None:
    client, _ = serve(ScriptedPipeline())
    response = client.post("/v1/chat/completions", content=json.dumps(CHAT),
                           headers={**AUTH, "content-type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 200, response.text
