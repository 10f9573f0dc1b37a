"""``/v1/realtime`` over a WebSocket, in the test process: the app's route (the key as a
header or as the browser's subprotocol, the pipeline not ready, the session limit, a wrong
``?model=`` / ``?intent=``), the socket's writer and receive loop (text and binary messages,
the message bound, a disconnect), and the hub's count given back however a session ends.
Against a scripted pipeline over Starlette's test client: milliseconds per test."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterator

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnictl.serving.app import create_app
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime import route
from omnictl.serving.realtime.channel import Outbox
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline, text_events

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
URL = "ws://localhost/v1/realtime"


def serve(pipeline: ScriptedPipeline | None = None, **state: Any) -> tuple[TestClient, ServingState]:
    serving = ServingState(model_name="m", pipeline=pipeline, api_key=KEY, **state)
    return TestClient(create_app(serving), base_url="http://localhost"), serving


def refusal(client: TestClient, url: str = URL, **kwargs: Any) -> WebSocketDisconnect:
    with pytest.raises(WebSocketDisconnect) as caught:
        with client.websocket_connect(url, **kwargs) as ws:
            while True:  # an error event may come before the close
                ws.receive_text()
    return caught.value


def events_until(ws: Any, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] != kind:
        events.append(json.loads(ws.receive_text()))
    return events


def ask(ws: Any) -> None:
    """A user text item, then a response to it."""
    item = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ws.send_text(json.dumps({"type": "conversation.item.create", "item": item}))
    ws.send_text(json.dumps({"type": "response.create"}))


def sessions(http: TestClient) -> dict[str, int]:
    """The hub's counts, as /health shows them."""
    counts: dict[str, int] = http.get("/health", headers=AUTH).json()["realtime"]
    return counts


@pytest.fixture
def client() -> Iterator[tuple[TestClient, ServingState]]:
    client, state = serve(ScriptedPipeline())
    with client:
        yield client, state


# --- who may open a session -------------------------------------------------------------


def test_a_key_as_a_bearer_header_opens_a_session_and_it_is_counted_until_closed(client: Any) -> None:
    http, state = client
    with http.websocket_connect(URL, headers=AUTH) as ws:
        created = json.loads(ws.receive_text())
        assert created["type"] == "session.created" and created["session"]["type"] == "realtime"
        assert (sessions(http)["sessions"], sessions(http)["websocket_sessions"]) == (1, 1)
    _wait(lambda: sessions(http)["sessions"] == 0)
    assert sessions(http)["websocket_sessions"] == 0


def test_a_browser_s_key_as_a_subprotocol_is_accepted_and_realtime_echoed_back(client: Any) -> None:
    http, _ = client
    protocols = ["realtime", route.KEY_PROTOCOL + KEY]
    with http.websocket_connect(URL, subprotocols=protocols) as ws:
        assert ws.accepted_subprotocol == "realtime"
        assert json.loads(ws.receive_text())["type"] == "session.created"
    # the key alone: accepted, and no subprotocol chosen (the browser offered none to echo)
    with http.websocket_connect(URL, subprotocols=[route.KEY_PROTOCOL + KEY]) as ws:
        assert ws.accepted_subprotocol is None
        assert json.loads(ws.receive_text())["type"] == "session.created"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"headers": {"Authorization": "Bearer nope"}},
        {"subprotocols": ["realtime", route.KEY_PROTOCOL + "nope"]},
        {"subprotocols": ["realtime", "other." + KEY]},  # the key without the key protocol's prefix
        {"subprotocols": [route.KEY_PROTOCOL + KEY + "x"]},
    ],
)
def test_a_missing_or_wrong_key_is_closed_in_the_handshake_and_counted(client: Any, kwargs: dict[str, Any]) -> None:
    http, state = client
    refused = refusal(http, **kwargs)
    assert (refused.code, refused.reason) == (1008, "missing or wrong API key")
    assert state.metrics.count("rejected") == 1
    assert sessions(http)["sessions"] == 0


def test_offered_protocols_are_split_and_trimmed() -> None:
    class Offer:
        headers = {"sec-websocket-protocol": " realtime , , openai-insecure-api-key.k ,x"}

    assert route._offered_protocols(Offer()) == ["realtime", "openai-insecure-api-key.k", "x"]  # type: ignore[arg-type]

    class Nothing:
        headers: dict[str, str] = {}

    assert route._offered_protocols(Nothing()) == []  # type: ignore[arg-type]


def test_a_pipeline_still_starting_says_try_later() -> None:
    http, state = serve(None)
    refused = refusal(http, headers=AUTH)
    assert (refused.code, refused.reason) == (1013, "the pipeline is still starting; retry shortly")


def test_a_full_server_refuses_in_the_protocol_s_words_then_closes_try_later() -> None:
    http, state = serve(ScriptedPipeline(), limits=Limits(max_realtime_sessions=1))
    with http, http.websocket_connect(URL, headers=AUTH) as first:
        assert json.loads(first.receive_text())["type"] == "session.created"
        with pytest.raises(WebSocketDisconnect) as caught, http.websocket_connect(URL, headers=AUTH) as second:
            error = json.loads(second.receive_text())
            second.receive_text()
        assert error["type"] == "error" and error["error"]["code"] == "session_limit_reached"
        assert "at most 1 realtime sessions at once" in error["error"]["message"]
        assert (caught.value.code, caught.value.reason) == (1013, "too many realtime sessions")
        assert state.metrics.count("rejected") == 1 and sessions(http)["sessions"] == 1


@pytest.mark.parametrize(
    ("query", "code", "param"),
    [
        ("?model=other", "model_not_found", "model"),
        ("?intent=dance", "invalid_value", "intent"),
    ],
)
def test_a_wrong_model_or_intent_is_an_error_event_a_warning_and_a_policy_close(
    client: Any, caplog: pytest.LogCaptureFixture, query: str, code: str, param: str
) -> None:
    http, state = client
    caplog.set_level(logging.WARNING, logger="omnictl.serving.realtime")
    with pytest.raises(WebSocketDisconnect) as caught, http.websocket_connect(URL + query, headers=AUTH) as ws:
        error = json.loads(ws.receive_text())
        ws.receive_text()
    assert error["type"] == "error" and (error["error"]["code"], error["error"]["param"]) == (code, param)
    assert caught.value.code == 1008 and caught.value.reason == error["error"]["message"][:100]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"realtime: connection refused: {error['error']['message']}"]
    assert state.metrics.count("rejected") == 1 and sessions(http)["sessions"] == 0


def test_a_served_alias_and_the_transcription_intent_are_accepted() -> None:
    http, _ = serve(ScriptedPipeline(), aliases=("alias",))
    with http, http.websocket_connect(URL + "?model=alias&intent=transcription", headers=AUTH) as ws:
        created = json.loads(ws.receive_text())
    assert created["type"] == "session.created" and created["session"]["type"] == "transcription"


# --- the session's traffic --------------------------------------------------------------


def test_text_events_are_answered_on_the_socket(client: Any) -> None:
    http, state = client
    state.pipeline.script = lambda inputs, modalities: text_events(["echo:", "hello"])  # type: ignore[union-attr]
    with http.websocket_connect(URL, headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_text(
            json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        )
        events_until(ws, "session.updated")
        ask(ws)
        events = events_until(ws, "response.done")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "echo: hello"
    assert events[-1]["response"]["status"] == "completed"


def test_a_binary_message_is_read_as_the_same_event(client: Any) -> None:
    http, _ = client
    with http.websocket_connect(URL, headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_bytes(json.dumps({"type": "input_audio_buffer.clear", "event_id": "b1"}).encode())
        assert events_until(ws, "input_audio_buffer.cleared")[-1]["type"] == "input_audio_buffer.cleared"
        ws.send_bytes(b"")  # an empty binary message: not JSON
        error = events_until(ws, "error")[-1]
    assert error["error"]["code"] == "invalid_json"
    assert error["error"]["message"].startswith("the message is not valid JSON: ")


def test_a_message_over_the_limit_is_refused_naming_it_and_the_session_goes_on() -> None:
    http, _ = serve(ScriptedPipeline(), limits=Limits(max_realtime_message_bytes=200))
    with http, http.websocket_connect(URL, headers=AUTH) as ws:
        events_until(ws, "session.created")
        big = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 400})
        ws.send_text(big)
        error = events_until(ws, "error")[-1]["error"]
        assert error["code"] == "message_too_large"
        assert error["message"] == (
            f"the message is {len(big)} bytes; this server takes events up to 200 bytes (send audio in smaller appends)"
        )
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear"}))
        assert events_until(ws, "input_audio_buffer.cleared")  # still open


def test_a_client_that_leaves_mid_answer_has_its_request_aborted_and_its_session_closed(client: Any) -> None:
    http, state = client
    pipeline: ScriptedPipeline = state.pipeline  # type: ignore[assignment]
    pipeline.hold = True  # the answer never ends by itself
    with http.websocket_connect(URL, headers=AUTH) as ws:
        events_until(ws, "session.created")
        ask(ws)
        events_until(ws, "response.created")
    _wait(lambda: sessions(http)["sessions"] == 0 and bool(pipeline.aborts))
    assert set(pipeline.aborts) == set(pipeline.requests) and len(pipeline.requests) == 1


# --- the writer, and hanging up ---------------------------------------------------------


def test_the_writer_sends_the_outbox_in_order_until_it_is_closed() -> None:
    sent: list[str] = []

    class Socket:
        async def send_text(self, text: str) -> None:
            sent.append(text)

    async def scenario() -> None:
        outbox = Outbox(1000)
        writing = asyncio.create_task(route._write(Socket(), outbox))  # type: ignore[arg-type]
        for n in range(3):
            outbox.put(ev.error_event(ev.EventError(f"message {n}", "x")))
        await asyncio.sleep(0)
        outbox.close()
        outbox.put(ev.error_event(ev.EventError("after the close", "x")))  # dropped
        await asyncio.wait_for(writing, 2)

    asyncio.run(scenario())
    assert [json.loads(text)["error"]["message"] for text in sent] == ["message 0", "message 1", "message 2"]


def test_hanging_up_uses_the_connection_s_hangup_when_the_server_has_one() -> None:
    calls: list[tuple[int, str]] = []

    class Socket:
        def __init__(self, scope: dict[str, Any]) -> None:
            self.scope = scope

    route._hang_up(
        Socket({"extensions": {"omnictl.hangup": lambda code, reason: calls.append((code, reason))}}), 1008, "why"
    )  # type: ignore[arg-type]
    route._hang_up(Socket({"extensions": {}}), 1008, "no hangup here")  # type: ignore[arg-type]
    route._hang_up(Socket({}), 1008, "no extensions at all")  # type: ignore[arg-type]
    assert calls == [(1008, "why")]


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within 5 s")
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("response", "param"),
    [({"max_output_tokens": 2**64}, "response.max_output_tokens"), ({"instructions": "a\ud800b"}, "response.instructions")],
)
def test_a_response_the_pipeline_could_not_take_is_refused_never_left_without_its_done(
    client: Any, response: dict[str, Any], param: str
) -> None:
    """Issue 40 bug 6, as clients met it: ``response.created``, then nothing. Values no encoder
    can carry are refused before a response starts; a response that starts ends in ``response.done``."""
    http, _ = client
    with http.websocket_connect(URL, headers=AUTH) as ws:
        assert json.loads(ws.receive_text())["type"] == "session.created"
        item = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ws.send_text(json.dumps({"type": "conversation.item.create", "item": item}))
        ws.send_text(json.dumps({"type": "response.create", "event_id": "r1", "response": response}))
        error = events_until(ws, "error")[-1]["error"]
        assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", param, "r1")
        ask(ws)  # and the session goes on: the next response is created and done
        answered = events_until(ws, "response.done")
        assert [e["type"] for e in answered].count("response.created") == 1
        assert answered[-1]["response"]["status"] == "completed"
