"""The protocol's event structs against the types the official `openai` package ships."""

from __future__ import annotations

import typing

import msgspec
import pydantic
import pytest
from openai.types.realtime import RealtimeClientEventParam, RealtimeServerEvent

from omnictl.serving.realtime import events as ev

SERVER = pydantic.TypeAdapter(RealtimeServerEvent)
ITEM = ev.Item(id="item_1", role="assistant", content=[ev.Content(type="output_audio", transcript="Paris.")])
RESPONSE = ev.Response(id="resp_1", status="completed", output_modalities=["audio"], output=[ITEM],
                       usage=ev.Usage(10, 5, 15))
PART = {"response_id": "resp_1", "item_id": "item_1"}
SESSION = ev.SessionObject(id="sess_1", model="m", instructions="", output_modalities=["audio"], max_output_tokens="inf",
                           audio={"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                            "turn_detection": msgspec.to_builtins(ev.ServerVad())},
                                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}})
EXAMPLES: list[ev.ServerEvent] = [
    ev.SessionCreated(session=SESSION), ev.SessionUpdated(session=SESSION),
    ev.SpeechStartedEvent(audio_start_ms=10, item_id="item_1"), ev.SpeechStoppedEvent(audio_end_ms=900, item_id="item_1"),
    ev.Committed(item_id="item_1"), ev.Cleared(), ev.ItemAdded(item=ITEM), ev.ItemDone(item=ITEM),
    ev.TranscriptionCompleted(item_id="item_1", content_index=0, transcript="hi", usage=ev.DurationUsage(1.5)),
    ev.ResponseCreated(response=RESPONSE), ev.ResponseDone(response=RESPONSE),
    ev.OutputItemAdded(response_id="resp_1", output_index=0, item=ITEM), ev.OutputItemDone(response_id="resp_1", output_index=0, item=ITEM),
    ev.ContentPartAdded(**PART, part=ev.Content(type="audio", transcript="")),
    ev.ContentPartDone(**PART, part=ev.Content(type="audio", transcript="Paris.")),
    ev.TextDelta(**PART, delta="Pa"), ev.TextDone(**PART, text="Paris."), ev.AudioDelta(**PART, delta="AAAA"),
    ev.AudioDone(**PART), ev.AudioTranscriptDelta(**PART, delta="Paris."), ev.AudioTranscriptDone(**PART, transcript="Paris."),
    ev.ErrorEvent(error=ev.ErrorDetail(type="invalid_request_error", code="x", message="m", param=None, event_id="e")),
    ev.TranscriptionDelta(item_id="item_1", content_index=0, delta="hi"),
    ev.ItemTruncated(item_id="item_1", content_index=0, audio_end_ms=300), ev.ItemDeleted(item_id="item_1"),
    ev.ItemRetrieved(item=ITEM), ev.OutputAudioBufferCleared(response_id="resp_1"),
    ev.OutputAudioBufferStarted(response_id="resp_1"), ev.OutputAudioBufferStopped(response_id="resp_1"),
]
TRANSCRIPTION_SESSION = ev.TranscriptionSessionObject(id="sess_2", audio={"input": {
    "format": {"type": "audio/pcmu"}, "transcription": {"model": "asr"},
    "turn_detection": msgspec.to_builtins(ev.SemanticVad(eagerness="low"))}})


def test_every_server_event_has_an_example() -> None:
    assert sorted(type(e).__struct_config__.tag for e in EXAMPLES) == sorted(ev.SERVER_EVENT_TYPES)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__struct_config__.tag)
def test_server_events_validate_as_the_openai_types(event: ev.ServerEvent) -> None:
    parsed = SERVER.validate_json(ev.encode(event))  # strict: every required field, the right types
    assert parsed.type == type(event).__struct_config__.tag
    assert set(msgspec.to_builtins(event)) <= set(type(parsed).model_fields)  # no field openai does not know


def _openai_client_event_types() -> set[str]:
    known = set()
    for member in typing.get_args(RealtimeClientEventParam):
        known |= set(typing.get_args(typing.get_type_hints(member)["type"]))
    return known


def test_client_event_names_are_the_openai_ones() -> None:
    assert set(ev.CLIENT_EVENT_TYPES) == _openai_client_event_types()  # every GA client event is taken


def test_a_transcription_session_validates_as_the_openai_type() -> None:
    parsed = SERVER.validate_json(ev.encode(ev.SessionCreated(session=TRANSCRIPTION_SESSION)))
    assert parsed.session.type == "transcription"
    assert parsed.session.audio.input.format.type == "audio/pcmu"
    assert parsed.session.audio.input.turn_detection.type == "semantic_vad"


def test_what_the_openai_client_sends_decodes() -> None:
    update = ev.decode_client_event('{"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"], '
                                    '"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": '
                                    '{"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 200, "silence_duration_ms": 300}}, '
                                    '"output": {"voice": "marin"}}, "tools": [], "tracing": "auto"}}')
    assert isinstance(update, ev.SessionUpdate)
    vad = update.session.audio.input.turn_detection  # type: ignore[union-attr]
    assert isinstance(vad, ev.ServerVad) and (vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms) == (0.6, 200, 300)
    item = ev.decode_client_event('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
                                  '"content": [{"type": "input_text", "text": "hi"}]}}')
    assert isinstance(item, ev.ConversationItemCreate) and item.item.content[0].text == "hi"


ALL_TYPES = ", ".join(ev.CLIENT_EVENT_TYPES)


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        ("nope", ("the message is not valid JSON: Expecting value: line 1 column 1 (char 0)", "invalid_json", None, None)),
        (b"\xff", None),  # bytes that are not UTF-8: the same code, whatever the decoder's words
        ("[" * 5000 + "]" * 5000, ("the message is nested more than 32 levels deep", "invalid_json", None, None)),
        ("[1]", ("an event must be a JSON object, got list", "invalid_event", None, None)),
        ('{"type": "session.update", "event_id": "' + "e" * 129 + '"}',
         ("'event_id' must be at most 128 ASCII characters", "invalid_value", "event_id", None)),
        ('{"type": "session.update", "event_id": "\\u00e9"}',
         ("'event_id' must be at most 128 ASCII characters", "invalid_value", "event_id", None)),
        ('{"type": "dance", "event_id": "e1"}',
         (f"unknown event type 'dance'; this server takes {ALL_TYPES}", "invalid_event_type", "type", "e1")),
        ('{"event_id": "e1"}', (f"unknown event type None; this server takes {ALL_TYPES}", "invalid_event_type", "type", "e1")),
        ('{"type": "response.create", "event_id": "e2", "response": {"max_output_tokens": 18446744073709551616}}',
         ("response.create: 'response.max_output_tokens' is out of range: integers must fit in 64 bits", "invalid_value",
          "response.max_output_tokens", "e2")),
        ('{"type": "conversation.item.create", "event_id": "e3", "item": {"role": "user", "content": [{"type": "input_text", "text": 5}]}}',
         ("conversation.item.create: Expected `str | null`, got `int` - at `$.item.content[0].text`", "invalid_value",
          "item.content[0].text", "e3")),
        ('{"type": "conversation.item.delete", "event_id": "e4"}',
         ("conversation.item.delete: Object missing required field `item_id`", "invalid_value", "item_id", "e4")),
        ('{"type": "conversation.item.create", "event_id": "e6", "item": {"role": "user", "content": [{"text": "x"}]}}',
         ("conversation.item.create: Object missing required field `type` - at `$.item.content[0]`", "invalid_value",
          "item.content[0].type", "e6")),
        ('{"type": "session.update", "instructions": "\\ud800"}',
         ("session.update: 'instructions' holds a lone surrogate ('\\ud800'); send valid Unicode", "invalid_value",
          "instructions", None)),
    ],
)
def test_a_client_event_refused_says_what_where_and_which_event(raw: str | bytes, refused: tuple[typing.Any, ...] | None) -> None:
    with pytest.raises(ev.EventError) as caught:
        ev.decode_client_event(raw)
    error = caught.value
    if refused is None:
        assert error.code == "invalid_json" and error.message.startswith("the message is not valid JSON: ")
        return
    assert (error.message, error.code, error.param, error.event_id) == refused
