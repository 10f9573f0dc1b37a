"""Regression tests for what an attacker on the network tried (issue 13, item 7), over raw
HTTP against a real server. Each failed on the code before its fix."""

from __future__ import annotations

import json
import struct
import time
from typing import Any

import httpx
import pytest

from tests.serving.harness import ServerProcess, wait_until
from tests.serving.test_errors import AUTH, ask, error_of, post


def settled(server: ServerProcess) -> bool:
    health = httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()
    return health["in_flight"] == 0 and health["pipeline_in_flight"] == 0


def raw_post(server: ServerProcess, text: str, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", content=text.encode(), timeout=30,
                      headers={"Content-Type": content_type, **AUTH})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"model": "fast", "max_tokens": 1000000000000000000000000000000, "messages": [{"role": "user", "content": "hi"}]}', "max_tokens"),
        ('{"model": "fast", "seed": 18446744073709551617, "messages": [{"role": "user", "content": "hi"}]}', "seed"),
        ('{"model": "fast", "messages": [{"role": "user", "content": "hi \\ud800"}]}', "messages[0].content"),
        ('{"model": "fast", "user": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}', "user"),
        ('{"model": "fast", "x": ' + "[" * 10_000 + "]" * 10_000 + ', "messages": []}', "body"),
    ],
    ids=["huge-max-tokens", "huge-seed", "surrogate-content", "surrogate-extra", "deep-nesting"],
)
def test_values_json_allows_but_nothing_can_use_are_400_naming_the_field(server: ServerProcess, body: str, field: str) -> None:
    response = raw_post(server, body)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == field


def test_a_lone_surrogate_model_on_a_stream_is_400_and_leaks_nothing(server: ServerProcess) -> None:
    body = '{"model": "\\ud800", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    for _ in range(3):
        response = raw_post(server, body)
        assert response.status_code == 400, response.text
        assert error_of(response)["param"] == "model"
    wait_until(lambda: settled(server))


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"stream": []}, "stream"), ({"stream": 0}, "stream"), ({"n": True}, "n"), ({"n": 1.0}, "n")],
)
def test_look_alike_values_are_refused(server: ServerProcess, extra: dict[str, Any], field: str) -> None:
    response = post(server, ask("hi", **extra))
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == field


def test_a_body_that_is_not_declared_json_is_415(server: ServerProcess) -> None:
    body = json.dumps(ask("hi"))
    response = raw_post(server, body, content_type="text/plain")
    assert response.status_code == 415
    assert error_of(response)["param"] == "Content-Type"
    assert raw_post(server, body, content_type="application/json; charset=utf-8").status_code == 200


def test_image_urls_never_reveal_whether_a_local_file_exists(server: ServerProcess, tmp_path: Any) -> None:
    real = tmp_path / "real.png"
    real.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    answers = []
    for url in (str(real), str(tmp_path / "missing.png"), "~/.ssh/id_rsa", f"file://{real}"):
        part = {"type": "image_url", "image_url": {"url": url}}
        response = post(server, {"model": "fast", "messages": [{"role": "user", "content": [part]}]})
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["param"] == "messages[0].content[0].image_url.url"
        assert str(tmp_path) not in error["message"] and "no image file" not in error["message"]
        answers.append(error["message"])
    assert len(set(answers)) == 1  # the same answer whether the file exists or not


def lying_wav(rate: int, payload: int = 6000) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + payload) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", payload) + bytes(payload))


def test_a_wav_header_claiming_1_hz_is_400_at_once(server: ServerProcess) -> None:
    import base64

    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(lying_wav(1)).decode(), "format": "wav"}}
    started = time.monotonic()
    response = post(server, {"model": "fast", "messages": [{"role": "user", "content": [part]}]})
    assert response.status_code == 400, response.text
    assert time.monotonic() - started < 5
    error = error_of(response)
    assert error["param"] == "messages[0].content[0].input_audio.data" and "sample rate" in error["message"]


PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.mark.parametrize("stream", [False, True])
def test_an_input_a_stage_cannot_take_is_400_naming_the_field_not_a_stage_failure(server: ServerProcess, stream: bool) -> None:
    part = {"type": "image_url", "image_url": {"url": PNG}}
    body = {"model": "fast", "stream": stream, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    response = post(server, body)
    field = "messages[0].content[1].image_url.url"
    if not stream:
        assert response.status_code == 400, response.text
        assert error_of(response)["param"] == field and error_of(response)["code"] == "invalid_request"
        return
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: "):])["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"


def test_a_body_that_never_arrives_is_408_not_an_open_connection_forever(server: ServerProcess) -> None:
    import socket
    from urllib.parse import urlparse

    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=20) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Authorization: {AUTH['Authorization']}\r\nContent-Length: 100\r\n\r\n".encode() + b'{"mod')
        started = time.monotonic()
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - started < 10
