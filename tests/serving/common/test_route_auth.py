"""Authentication is one mechanism: every route of the app's table that takes input goes
through ``auth.requires_key`` / ``auth.requires_key_socket``, but the documented open ones."""

from __future__ import annotations

import pytest
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnictl.serving.app import create_app
from omnictl.serving.common.auth import OPEN_ROUTES, is_keyed
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline

KEY = "sk-test"


def unkeyed_routes(state: ServingState) -> list[str]:
    """The routes of the app's table that skip the one key check, open ones excepted."""
    app = create_app(state)
    unkeyed: list[str] = []
    for route in app.routes:
        assert isinstance(route, (Route, WebSocketRoute)), f"{route!r}: a route kind this test cannot read"
        if route.path not in OPEN_ROUTES and not is_keyed(route.endpoint):
            unkeyed.append(route.path)
    return unkeyed


def test_every_route_but_the_open_ones_goes_through_the_key() -> None:
    unkeyed = unkeyed_routes(ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key=KEY))
    assert unkeyed == [], f"routes that take input without auth.requires_key: {unkeyed}"


def test_the_walk_finds_a_route_added_without_the_key() -> None:
    # The test above can fail: an endpoint added bare to the table is named.
    state = ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key=KEY)
    app = create_app(state)

    async def bare(request: object) -> None:
        return None

    app.router.routes.append(Route("/v1/new", bare, methods=["POST"]))
    assert [r.path for r in app.routes if isinstance(r, (Route, WebSocketRoute))
            and r.path not in OPEN_ROUTES and not is_keyed(r.endpoint)] == ["/v1/new"]


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/audio/speech"),
        ("POST", "/v1/audio/transcriptions"),
        ("POST", "/v1/audio/translations"),
        ("GET", "/v1/audio/voices"),
        ("POST", "/v1/realtime/calls"),
        ("POST", "/v1/realtime/calls/abc/hangup"),
        ("POST", "/v1/requests/abc/abort"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
    ],
)
def test_each_keyed_http_route_answers_401_without_the_key(method: str, path: str) -> None:
    state = ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key=KEY)
    with TestClient(create_app(state), base_url="http://localhost") as client:
        response = client.request(method, path, headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401, (path, response.status_code, response.text)
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_the_websocket_without_the_key_is_closed_in_the_handshake() -> None:
    state = ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key=KEY)
    with TestClient(create_app(state), base_url="http://localhost") as client:
        with pytest.raises(WebSocketDisconnect) as closed:
            with client.websocket_connect("ws://localhost/v1/realtime"):
                pass
    assert closed.value.code == 1008
    assert state.metrics.count("rejected") == 1


def test_open_routes_answer_without_the_key() -> None:
    state = ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key=KEY)
    with TestClient(create_app(state), base_url="http://localhost") as client:
        assert client.get("/").status_code == 200
        health = client.get("/health")
    assert set(health.json()) == {"status"}  # the verdict only: its details are the key's
