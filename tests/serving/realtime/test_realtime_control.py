"""`/v1/realtime` under interruption and abuse: barge-in, cancel, malformed events, limits, the key."""

from __future__ import annotations

import base64
import json
from typing import Any, Iterator

import httpx
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.serving.harness import API_KEY, ServerProcess, wait_until
from tests.serving.realtime.speech import chunks, collect_until_done, sample, silence

STORY = "Tell me a long story about a dragon who lives in a castle by the sea."


def _idle(server: ServerProcess) -> bool:
    """No request left anywhere: server, coordinator, and every stage's buffers and slots."""
    health = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()
    stages = health["stages"].values()
    return (health["in_flight"] == 0 and health["pipeline_in_flight"] == 0
            and all(s.get("requests", 0) == 0 and s.get("slots_in_use", 0) == 0 for s in stages))


def _in_flight_metric(server: ServerProcess) -> float:
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
    return float(next(line for line in text.splitlines() if line.startswith("omnictl_requests_in_flight ")).split()[-1])


@pytest.fixture()
def client(voice_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=voice_server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture()
def raw(voice_server: ServerProcess) -> Iterator[Any]:
    """A plain WebSocket (for what the typed client would not send), manual turns, text answers."""
    url = voice_server.url.replace("http://", "ws://") + "/v1/realtime?model=voice-assistant"
    with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                                                   "audio": {"input": {"turn_detection": None}}}}))
        assert json.loads(ws.recv())["type"] == "session.updated"
        yield ws


def _next_of(ws: Any, kind: str) -> dict[str, Any]:
    for _ in range(2000):
        event = json.loads(ws.recv(timeout=120))
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind} event")


def test_speech_during_an_answer_cancels_it_everywhere(client: openai.OpenAI, voice_server: ServerProcess) -> None:
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 200,
                                           "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}}})
        assert connection.recv().type == "session.updated"
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": STORY}]})
        connection.response.create()
        while (event := connection.recv()).type != "response.output_audio.delta":
            assert event.type != "response.done", event
        response_id = event.response_id
        for audio in chunks(sample("sky_colour") + silence(800)):  # the user talks over the answer
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection)
        types = [e.type for e in events]
        assert "input_audio_buffer.speech_started" in types
        done = events[-1].response
        assert done.id == response_id and done.status == "cancelled" and done.status_details.reason == "turn_detected"
        assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
        connection.input_audio_buffer.clear()  # a marker: everything sent after response.done comes before it
        later = []
        while (event := connection.recv()).type != "input_audio_buffer.cleared":
            later.append(event)
        assert not [e for e in later if e.type == "response.output_audio.delta"], [e.type for e in later]
    wait_until(lambda: _idle(voice_server), timeout=30)
    assert _in_flight_metric(voice_server) == 0


def test_response_cancel_and_a_second_response_while_one_runs(raw: Any) -> None:
    raw.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                       "content": [{"type": "input_text", "text": STORY}]}}))
    raw.send(json.dumps({"type": "response.create", "event_id": "first", "response": {"max_output_tokens": 200}}))
    created = _next_of(raw, "response.created")
    raw.send(json.dumps({"type": "response.create", "event_id": "second"}))
    error = _next_of(raw, "error")["error"]
    assert error["event_id"] == "second" and error["code"] == "conversation_already_has_active_response"
    raw.send(json.dumps({"type": "response.cancel", "event_id": "stop"}))
    done = _next_of(raw, "response.done")["response"]
    assert done["id"] == created["response"]["id"] and done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "client_cancelled"
    raw.send(json.dumps({"type": "response.cancel", "event_id": "again"}))
    error = _next_of(raw, "error")["error"]
    assert error["event_id"] == "again" and error["code"] == "response_cancel_not_active"


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ('{"type": "input_audio_buffer.shout", "event_id": "e1"}', "invalid_event_type", "type"),
        ('{"type": "input_audio_buffer.append", "event_id": "e1", "audio": "%%% not base64"}', "invalid_base64", "audio"),
        ('{"type": "input_audio_buffer.append", "event_id": "e1", "audio": "AAAA"}', "invalid_audio", "audio"),
        ('{"type": "session.update", "event_id": "e1", "session": {"type": "realtime", "audio": {"input": '
         '{"format": {"type": "audio/g729"}}}}}', "unsupported_audio_format", "session.audio.input.format.type"),
        ('{"type": "session.update", "event_id": "e1", "session": {"type": "realtime", "audio": {"output": '
         '{"format": {"type": "audio/pcmu", "rate": 16000}}}}}', "unsupported_audio_format", "session.audio.output.format.rate"),
        ('{"type": "session.update", "event_id": "e1", "session": {"type": "video"}}', "unsupported_session_type", "session.type"),
        ('{"type": "session.update", "event_id": "e1", "session": {"audio": {"input": {"turn_detection": '
         '{"type": "server_vad", "threshold": "high"}}}}}', "invalid_value", "session.audio.input.turn_detection.threshold"),
        ('{"type": "input_audio_buffer.commit", "event_id": "e1"}', "input_audio_buffer_commit_empty", None),
        ('{"type": "conversation.item.create", "event_id": "e1", "item": {"type": "message", "role": "system", '
         '"content": [{"type": "input_audio", "audio": "AAAA"}]}}', "invalid_value", "item.content[0].type"),
        ("[1, 2, 3]", "invalid_event", None),
        ("{not json", "invalid_json", None),
        # tools are refused, not ignored: no stage produces tool calls
        ('{"type": "session.update", "event_id": "e1", "session": {"tools": [{"type": "function", "name": "f"}]}}',
         "invalid_value", "session.tools"),
        ('{"type": "session.update", "event_id": "e1", "session": {"tool_choice": "required"}}',
         "invalid_value", "session.tool_choice"),
        ('{"type": "response.create", "event_id": "e1", "response": {"tools": [{"type": "function", "name": "f"}]}}',
         "invalid_value", "response.tools"),
    ],
)
def test_a_malformed_event_gets_an_error_naming_it_and_the_session_goes_on(raw: Any, message: str, code: str, param: str | None) -> None:
    raw.send(message)
    error = _next_of(raw, "error")["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["event_id"] == ("e1" if "e1" in message else None)
    assert error["type"] == "invalid_request_error" and error["message"]
    raw.send(json.dumps({"type": "input_audio_buffer.clear", "event_id": "after"}))  # still listening
    assert _next_of(raw, "input_audio_buffer.cleared")


def test_limits_name_themselves(raw: Any) -> None:
    big = json.dumps({"type": "input_audio_buffer.append", "event_id": "huge", "audio": "A" * (2 * 1024 * 1024)})
    raw.send(big)
    error = _next_of(raw, "error")["error"]
    assert error["code"] == "message_too_large" and str(1024 * 1024) in error["message"]
    ten_seconds = base64.b64encode(bytes(480_000)).decode()  # 10 s of pcm16 per append, under the message limit
    codes = []
    for i in range(13):  # the buffer holds 120 s: the thirteenth append overflows it
        raw.send(json.dumps({"type": "input_audio_buffer.append", "event_id": f"a{i}", "audio": ten_seconds}))
    raw.send(json.dumps({"type": "input_audio_buffer.clear"}))
    while (event := json.loads(raw.recv(timeout=30)))["type"] != "input_audio_buffer.cleared":
        codes.append((event["error"]["event_id"], event["error"]["code"], event["error"]["message"]))
    assert len(codes) == 1 and codes[0][:2] == ("a12", "input_audio_buffer_too_large") and "120 s" in codes[0][2], codes


def test_the_api_key_is_required(voice_server: ServerProcess) -> None:
    url = voice_server.url.replace("http://", "ws://") + "/v1/realtime"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, additional_headers={"Authorization": "Bearer wrong"}):
            pass
    assert refused.value.response.status_code == 403
    # a browser cannot set headers: it sends the key as a subprotocol, as OpenAI's browser clients do
    with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"]) as ws:  # type: ignore[list-item]
        assert json.loads(ws.recv())["type"] == "session.created"


def test_what_clients_send_by_default_about_tools_is_accepted(raw: Any) -> None:
    raw.send(json.dumps({"type": "session.update", "event_id": "e1", "session": {"tools": [], "tool_choice": "auto"}}))
    assert _next_of(raw, "session.updated")
