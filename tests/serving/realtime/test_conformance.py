"""Every GA client event of the Realtime protocol (the `openai` package's client-event union),
sent valid to a real `omnictl serve` of the fast topology, gets the protocol's own answer;
the handshake's `?model=` and `?intent=` are checked; G.711 sessions convert at the edge."""

from __future__ import annotations

import base64
import json
import typing
from typing import Any, Callable, Iterator

import pydantic
import pytest
from openai.types.realtime import RealtimeClientEvent, RealtimeClientEventParam
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.serving.harness import API_KEY, ServerProcess, wait_until
from tests.serving.realtime.speech import silence

CLIENT = pydantic.TypeAdapter(RealtimeClientEvent)
USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}


class Raw:
    """A plain WebSocket speaking JSON events."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    def send(self, event: dict[str, Any]) -> None:
        CLIENT.validate_python(event)  # a valid instance of the openai type, not just something we take
        self.ws.send(json.dumps(event))

    def next_of(self, *kinds: str) -> dict[str, Any]:
        for _ in range(2000):
            event = json.loads(self.ws.recv(timeout=60))
            if event["type"] in kinds:
                return event
        raise AssertionError(f"none of {kinds}")

    def until(self, kind: str) -> list[dict[str, Any]]:
        events = []
        while (event := json.loads(self.ws.recv(timeout=60)))["type"] != kind:
            events.append(event)
        return [*events, event]

    def answer(self, text: str = "hello there") -> dict[str, Any]:
        """A spoken answer (text and audio); its response.done."""
        self.send({"type": "conversation.item.create", "item": {**USER_TEXT, "content": [{"type": "input_text", "text": text}]}})
        self.send({"type": "response.create"})
        return self.next_of("response.done")


def _url(server: ServerProcess, query: str = "model=fast") -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?" + query


@pytest.fixture()
def raw(server: ServerProcess) -> Iterator[Raw]:
    with connect(_url(server), additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None) as ws:
        session = Raw(ws)
        assert session.next_of("session.created")
        session.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text", "audio"],
                                                             "audio": {"input": {"turn_detection": None}}}})
        assert session.next_of("session.updated")
        yield session


def _audio(ms: int) -> str:
    return base64.b64encode(silence(ms)).decode()


def _check_session_update(raw: Raw) -> None:
    raw.send({"type": "session.update", "event_id": "u", "session": {"type": "realtime", "instructions": "Be brief."}})
    assert raw.next_of("session.updated", "error")["type"] == "session.updated"


def _check_append(raw: Raw) -> None:
    raw.send({"type": "input_audio_buffer.append", "audio": _audio(200)})  # answered by nothing, no error
    raw.send({"type": "input_audio_buffer.clear"})
    assert [e["type"] for e in raw.until("input_audio_buffer.cleared")] == ["input_audio_buffer.cleared"]


def _check_commit(raw: Raw) -> None:
    raw.send({"type": "input_audio_buffer.append", "audio": _audio(300)})
    raw.send({"type": "input_audio_buffer.commit"})
    assert raw.next_of("input_audio_buffer.committed", "error")["type"] == "input_audio_buffer.committed"


def _check_clear(raw: Raw) -> None:
    raw.send({"type": "input_audio_buffer.clear"})
    assert raw.next_of("input_audio_buffer.cleared", "error")["type"] == "input_audio_buffer.cleared"


def _check_item_create(raw: Raw) -> None:
    raw.send({"type": "conversation.item.create", "item": USER_TEXT})
    assert raw.next_of("conversation.item.added", "error")["type"] == "conversation.item.added"


def _check_truncate(raw: Raw) -> None:
    item = raw.answer()["response"]["output"][0]
    raw.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0, "audio_end_ms": 0})
    truncated = raw.next_of("conversation.item.truncated", "error")
    assert truncated == {**truncated, "type": "conversation.item.truncated", "item_id": item["id"], "audio_end_ms": 0}
    raw.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    assert raw.next_of("conversation.item.retrieved")["item"]["content"][0]["transcript"] == ""  # nothing heard


def _check_delete(raw: Raw) -> None:
    raw.send({"type": "conversation.item.create", "item": {**USER_TEXT, "id": "item_to_delete"}})
    raw.send({"type": "conversation.item.delete", "item_id": "item_to_delete"})
    deleted = raw.next_of("conversation.item.deleted", "error")
    assert (deleted["type"], deleted.get("item_id")) == ("conversation.item.deleted", "item_to_delete"), deleted
    raw.send({"type": "conversation.item.delete", "event_id": "again", "item_id": "item_to_delete"})
    error = raw.next_of("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("item_not_found", "item_id", "again")


def _check_retrieve(raw: Raw) -> None:
    raw.send({"type": "conversation.item.create", "item": {**USER_TEXT, "id": "item_kept"}})
    raw.send({"type": "conversation.item.retrieve", "item_id": "item_kept"})
    item = raw.next_of("conversation.item.retrieved", "error")["item"]
    assert item["id"] == "item_kept" and item["content"][0]["text"] == "hello there"


def _check_response_create(raw: Raw) -> None:
    raw.send({"type": "conversation.item.create", "item": USER_TEXT})
    raw.send({"type": "response.create"})
    assert raw.next_of("response.created", "error")["type"] == "response.created"
    assert raw.next_of("response.done")["response"]["status"] == "completed"


def _check_response_cancel(raw: Raw) -> None:
    raw.send({"type": "response.cancel", "event_id": "c"})  # nothing to cancel: the protocol's own error
    error = raw.next_of("error")["error"]
    assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "c")


def _check_output_clear(raw: Raw) -> None:
    raw.send({"type": "output_audio_buffer.clear", "event_id": "o"})
    error = raw.next_of("error")["error"]
    assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "o")


CHECKS: dict[str, Callable[[Raw], None]] = {
    "session.update": _check_session_update,
    "input_audio_buffer.append": _check_append,
    "input_audio_buffer.commit": _check_commit,
    "input_audio_buffer.clear": _check_clear,
    "conversation.item.create": _check_item_create,
    "conversation.item.truncate": _check_truncate,
    "conversation.item.delete": _check_delete,
    "conversation.item.retrieve": _check_retrieve,
    "response.create": _check_response_create,
    "response.cancel": _check_response_cancel,
    "output_audio_buffer.clear": _check_output_clear,
}


def _union_types() -> list[str]:
    return sorted(t for member in typing.get_args(RealtimeClientEventParam)
                  for t in typing.get_args(typing.get_type_hints(member)["type"]))


def test_every_client_event_of_the_openai_union_has_a_check() -> None:
    assert sorted(CHECKS) == _union_types()  # a client event openai adds fails here until it is handled


@pytest.mark.parametrize("kind", _union_types())
def test_each_client_event_gets_the_protocols_answer(raw: Raw, kind: str) -> None:
    CHECKS[kind](raw)
    raw.send({"type": "input_audio_buffer.clear", "event_id": "marker"})  # the session goes on
    assert raw.next_of("input_audio_buffer.cleared")


def _refusal(server: ServerProcess, query: str) -> dict[str, Any]:
    with connect(_url(server, query), additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        error = json.loads(ws.recv(timeout=30))
        with pytest.raises(ConnectionClosed):  # then the server closes the socket
            ws.recv(timeout=30)
    assert error["type"] == "error"
    return error["error"]


def test_the_handshakes_model_and_intent_are_checked(server: ServerProcess) -> None:
    error = _refusal(server, "model=gpt-realtime")
    assert (error["code"], error["param"]) == ("model_not_found", "model") and "'fast'" in error["message"]
    error = _refusal(server, "model=fast&intent=transcription")  # the fast topology cannot transcribe
    assert (error["code"], error["param"]) == ("unsupported_session_type", "intent")
    error = _refusal(server, "intent=chat")
    assert (error["code"], error["param"]) == ("invalid_value", "intent")


def test_a_refused_event_is_logged_as_a_warning(raw: Raw, server: ServerProcess) -> None:
    raw.ws.send(json.dumps({"type": "conversation.item.truncate", "event_id": "t1", "item_id": "nope",
                            "content_index": 0, "audio_end_ms": 0}))
    assert raw.next_of("error")["error"]["code"] == "item_not_found"
    # the server logs before it sends, but its output reaches this process through a pipe
    # and a reader thread: the line may land a moment after the event
    lines = wait_until(lambda: [line for line in server.text().splitlines() if "no item 'nope'" in line], timeout=5)
    assert all(" WARNING " in line for line in lines), lines


def test_truncate_cuts_a_spoken_answer_to_the_words_its_audio_had_said(raw: Raw) -> None:
    item = raw.answer("hello there my friend")["response"]["output"][0]  # one 100 ms tone per word
    assert item["content"][0]["transcript"].split() == ["echo:", "hello", "there", "my", "friend"]
    raw.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0, "audio_end_ms": 250})
    assert raw.next_of("conversation.item.truncated", "error")["type"] == "conversation.item.truncated"
    raw.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    assert raw.next_of("conversation.item.retrieved")["item"]["content"][0]["transcript"] == "echo: hello"
    raw.send({"type": "conversation.item.truncate", "event_id": "far", "item_id": item["id"], "content_index": 0,
              "audio_end_ms": 5000})
    error = raw.next_of("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "audio_end_ms", "far")
    raw.send({"type": "conversation.item.create", "item": {**USER_TEXT, "id": "item_user"}})
    raw.send({"type": "conversation.item.truncate", "event_id": "u", "item_id": "item_user", "content_index": 0,
              "audio_end_ms": 0})
    error = raw.next_of("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "item_id", "u")


def test_a_cancelled_answer_is_incomplete_and_holds_only_what_was_sent(raw: Raw) -> None:
    raw.send({"type": "conversation.item.create", "item": {**USER_TEXT, "content": [{"type": "input_text", "text": "slowly please"}]}})
    raw.send({"type": "response.create"})
    sent: list[dict[str, Any]] = []
    while len([e for e in sent if e["type"] == "response.output_audio.delta"]) < 2:
        sent.append(raw.next_of("response.output_audio.delta", "response.output_audio_transcript.delta",
                                "response.output_text.delta"))
    raw.send({"type": "response.cancel"})
    events = raw.until("response.done")
    done = events[-1]["response"]
    deltas = [e for e in sent + events if e["type"] == "response.output_audio_transcript.delta"]
    said = "".join(e["delta"] for e in deltas)
    item = done["output"][0]
    assert done["status"] == "cancelled" and item["status"] == "incomplete"
    assert item["content"][0]["transcript"].split() == said.split() and len(said.split()) < 10
    texts = "".join(e["delta"] for e in sent + events if e["type"] == "response.output_text.delta")
    assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == texts
    raw.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    retrieved = raw.next_of("conversation.item.retrieved")["item"]
    assert retrieved["status"] == "incomplete" and retrieved["content"][0]["transcript"] == item["content"][0]["transcript"]
