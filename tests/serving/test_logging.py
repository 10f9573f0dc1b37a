"""Log records of one request carry its id, in text and JSON (a real server's output)."""

from __future__ import annotations

import io
import json
import logging

import httpx
import pytest

from omnictl.logs import configure, request_scope
from tests.serving.harness import FAST_TOPOLOGY, start_server, stop_server


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_records_inside_a_request_scope_carry_its_id(fmt: str) -> None:
    out = io.StringIO()
    handler = configure("info", fmt, stream=out)  # type: ignore[arg-type]
    try:
        log = logging.getLogger("omnictl.test")
        with request_scope("chatcmpl-abc"):
            log.warning("inside")
        log.warning("outside")
    finally:
        logging.getLogger("omnictl").removeHandler(handler)
    inside, outside = out.getvalue().splitlines()
    if fmt == "json":
        assert json.loads(inside)["request_id"] == "chatcmpl-abc" and json.loads(inside)["message"] == "inside"
        assert json.loads(outside)["request_id"] == "-"
    else:
        assert "request=chatcmpl-abc" in inside and "request=-" in outside


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_failed_request_is_logged_once_with_its_id_and_why(fmt: str) -> None:
    server = start_server(str(FAST_TOPOLOGY), "--log-format", fmt)
    try:
        body = {"model": "fast", "messages": [{"role": "user", "content": "explode"}]}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": f"boom-{fmt}"}, timeout=30)
        assert response.status_code == 500
    finally:
        assert stop_server(server) == 0
    lines = [line for line in server.text().splitlines() if f"boom-{fmt}" in line]
    assert len(lines) == 1, server.text()
    if fmt == "json":
        record = json.loads(lines[0])
        assert record["request_id"] == f"boom-{fmt}" and record["level"] == "WARNING"
        assert "prep exploded on purpose" in record["message"]
    else:
        assert f"request=boom-{fmt}" in lines[0] and "prep exploded on purpose" in lines[0]
