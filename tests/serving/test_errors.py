"""Every bad-input and failure path of the HTTP API, over raw HTTP against a real server."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from tests.serving.harness import API_KEY, ServerProcess, wait_until

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(server: ServerProcess, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(
        server.url + "/v1/chat/completions", content=content, timeout=30,
        headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
    )


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fast", "messages": [{"role": "user", "content": text}], **extra}


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["x-request-id"]  # every response carries its id, errors too
    error: dict[str, Any] = response.json()["error"]
    return error


def test_invalid_json_is_400(server: ServerProcess) -> None:
    response = post(server, None, raw=b'{"messages": [')
    assert response.status_code == 400
    assert "not valid JSON" in error_of(response)["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "fast"}, "messages"),
        (ask("hi", temperature=9), "temperature"),
        (ask("hi", max_tokens="many"), "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "###"}}]}]},
         "messages[0].content[0].input_audio.data"),
    ],
)
def test_bad_fields_are_400_naming_the_field(server: ServerProcess, body: dict[str, Any], field: str) -> None:
    response = post(server, body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == field and field.split("[")[0] in error["message"]


def test_a_modality_it_cannot_produce_is_400_saying_what_it_can(server: ServerProcess) -> None:
    response = post(server, ask("hi", modalities=["text", "video"]))
    assert response.status_code == 400
    assert "it produces audio, text" in error_of(response)["message"]


def test_an_audio_format_it_cannot_produce_is_400(server: ServerProcess) -> None:
    response = post(server, ask("hi", modalities=["audio"], audio={"voice": "x", "format": "ogg"}))
    assert response.status_code == 400
    assert "wav, pcm16, mp3, opus, aac, flac" in error_of(response)["message"]


def test_oversized_body_is_413(server: ServerProcess) -> None:
    body = json.dumps(ask("word " * 60_000)).encode()  # ~300 KB against a 0.25 MB limit
    response = post(server, None, raw=body)
    assert response.status_code == 413
    error = error_of(response)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "payload_too_large", "body")
    assert error["message"] == f"request body is {len(body)} bytes; the limit is {int(0.25 * 1024 * 1024)}"


def test_oversized_audio_is_413(server: ServerProcess) -> None:
    data = base64.b64encode(bytes(80_000)).decode()  # 80 KB decoded against 0.05 MB
    content = [{"type": "input_audio", "input_audio": {"data": data, "format": "pcm16"}}]
    response = post(server, {"messages": [{"role": "user", "content": content}]})
    assert response.status_code == 413
    error = error_of(response)
    assert (error["code"], error["param"]) == ("payload_too_large", "messages[0].content[0].input_audio.data")
    assert error["message"].startswith("messages[0].content[0].input_audio.data: decodes to more than ")


@pytest.mark.parametrize("headers", [{"Authorization": ""}, {"Authorization": "Bearer wrong"}])
def test_missing_or_wrong_api_key_is_401(server: ServerProcess, headers: dict[str, str]) -> None:
    response = post(server, ask("hi"), headers=headers)
    assert response.status_code == 401
    assert error_of(response)["type"] == "authentication_error"


def test_stage_failure_streamed_ends_with_an_error_event(server: ServerProcess) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=ask("explode", stream=True),
                      headers=AUTH, timeout=30) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "prep" in error["message"] and error["code"] == "stage_failed"


def test_client_request_id_is_used_and_echoed(server: ServerProcess) -> None:
    response = post(server, ask("hi"), headers={"X-Request-Id": "my-trace-42"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "my-trace-42" == response.json()["id"]


def _idle(server: ServerProcess) -> bool:
    """No request left anywhere: server, coordinator, and every stage's buffers and slots."""
    health = httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()
    stages = health["stages"].values()
    return (health["in_flight"] == 0 and health["pipeline_in_flight"] == 0
            and all(s.get("requests", 0) == 0 and s.get("slots_in_use", 0) == 0 for s in stages))


def _metric(server: ServerProcess, line_start: str) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=10).text
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).split()[-1])


def test_a_client_that_disconnects_aborts_its_request(server: ServerProcess) -> None:
    aborted = 'omnictl_requests_total{outcome="aborted"}'
    before = _metric(server, aborted)
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=AUTH, timeout=30,
                      json=ask("answer slowly", stream=True, modalities=["text", "audio"])) as response:
        for line in response.iter_lines():
            if '"content":"echo:"' in line:
                break  # got the first word; the answer would take seconds more
    # leaving the `with` closed the connection mid-answer
    wait_until(lambda: _metric(server, aborted) == before + 1)
    wait_until(lambda: _idle(server))


def test_abort_endpoint_ends_the_stream(server: ServerProcess) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                      headers={**AUTH, "X-Request-Id": "to-abort-1"}, json=ask("answer slowly", stream=True)) as response:
        lines = response.iter_lines()
        for line in lines:
            if '"content":"echo:"' in line:
                break
        stopped = httpx.post(server.url + "/v1/requests/to-abort-1/abort", headers=AUTH, timeout=10)
        assert stopped.status_code == 200
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["error"]["code"] == "aborted"
    assert httpx.post(server.url + "/v1/requests/to-abort-1/abort", headers=AUTH, timeout=10).status_code == 404
    wait_until(lambda: _idle(server))


BROKE_CONTRACT = "stage 'speak' broke the output contract: a 'audio' terminal's stream chunk must be omnictl.outputs.AudioChunk"


def test_a_terminal_that_breaks_the_output_contract_is_an_error_event_naming_the_stage(server: ServerProcess) -> None:
    body = ask("garble slowly", modalities=["text", "audio"], stream=True)  # slowly: still running when it breaks
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "stage_failed" and BROKE_CONTRACT in error["message"]
    wait_until(lambda: _idle(server), timeout=5)  # aborted at once, not left to finish (~12 s more)


def test_a_terminal_that_breaks_the_output_contract_is_a_500_naming_the_stage(server: ServerProcess) -> None:
    response = post(server, ask("garble", modalities=["text", "audio"]))
    assert response.status_code == 500
    assert error_of(response)["code"] == "stage_failed" and BROKE_CONTRACT in error_of(response)["message"]
    assert "Traceback" not in response.text


def test_a_request_id_in_flight_or_already_used_is_409(server: ServerProcess) -> None:
    headers = {**AUTH, "X-Request-Id": "twice-1"}
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=headers, timeout=30,
                      json=ask("answer slowly", stream=True)) as first:
        lines = first.iter_lines()  # one iterator: dropping a partly read one closes the response
        for line in lines:
            if '"content":"echo:"' in line:
                break
        second = post(server, ask("hi"), headers={"X-Request-Id": "twice-1"})
        assert second.status_code == 409 and error_of(second)["code"] == "duplicate_request_id"
    wait_until(lambda: _idle(server))
    third = post(server, ask("hi"), headers={"X-Request-Id": "twice-1"})  # finished (aborted) ids stay used
    assert third.status_code == 409
