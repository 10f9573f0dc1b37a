"""The app before its pipeline is up: health says 503, requests are told to retry."""

from __future__ import annotations

from starlette.testclient import TestClient

from omnictl.serving.app import ServingState, create_app


def test_health_and_requests_are_503_while_starting() -> None:
    client = TestClient(create_app(ServingState(model_name="m")), base_url="http://localhost")
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "starting"
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503
    assert "starting" in response.json()["error"]["message"]
    assert response.headers["x-request-id"].startswith("chatcmpl-")


def test_a_malformed_request_id_header_is_400() -> None:
    client = TestClient(create_app(ServingState(model_name="m")), base_url="http://localhost")
    response = client.post("/v1/chat/completions", headers={"X-Request-Id": "bad id with spaces"}, json={})
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-Request-Id"
