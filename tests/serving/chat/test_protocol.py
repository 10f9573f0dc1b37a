from __future__ import annotations

import base64

import pytest

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.inputs import ChatRequest, SamplingParams, TextPart
from omnictl.serving.chat.protocol import Limits, parse_chat_request

BOTH = {"thinker": "text", "vocoder": "audio"}
TEXT_ONLY = {"decode": "text"}


def body(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_minimal_request_becomes_the_typed_pipeline_request() -> None:
    req = parse_chat_request(body(max_tokens=5, temperature=0, stop="x", seed=3), BOTH)
    assert req.modalities == ["text"]
    assert req.stream is False
    assert isinstance(req.inputs, ChatRequest)
    assert [(m.role, m.parts) for m in req.inputs.messages] == [("user", (TextPart(text="hi"),))]
    assert req.inputs.sampling == SamplingParams(max_tokens=5, temperature=0.0, stop=("x",), seed=3)
    assert req.inputs.voice is None
    assert req.inputs.params() == {"sampling": {"max_tokens": 5, "temperature": 0.0, "stop": ["x"], "seed": 3}}


def test_audio_modality_and_format() -> None:
    req = parse_chat_request(body(modalities=["text", "audio"], audio={"voice": "joe", "format": "pcm16"}, stream=True), BOTH)
    assert req.modalities == ["text", "audio"]
    assert (req.audio_format, req.inputs.voice, req.stream) == ("pcm16", "joe", True)


def test_default_modalities_without_a_text_terminal() -> None:
    assert parse_chat_request(body(), {"vocoder": "audio"}).modalities == ["audio"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "@@", "format": "wav"}}]}]},
         "messages[0].content[0].input_audio.data"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "mp3"}}]}]},
         "messages[0].content[0].input_audio.format"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stop": [1]}, "stop[0]"),
        ({"stop": ["ok", ""]}, "stop[1]"),
        ({"top_p": 0}, "top_p"),
        ({"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages[0].colour"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
         "messages[0].content[0].input_audio.data"),  # valid base64, not a WAV file
        ({"audio": {"voice": ""}}, "audio.voice"),
        ({"stream": "yes"}, "stream"),
        ({"n": 2}, "n"),
        ({"audio": {"format": "ogg"}}, "audio.format"),
        ({"audio": {"format": ["mp3"]}}, "audio.format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_fields_are_named(extra: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body(**extra), BOTH)
    assert info.value.field == field
    assert field.split("[")[0].split(".")[0] in str(info.value)


def test_a_modality_the_topology_cannot_produce_says_what_it_can() -> None:
    with pytest.raises(InvalidRequest, match="cannot produce 'audio'; it produces text") as info:
        parse_chat_request(body(modalities=["text", "audio"]), TEXT_ONLY)
    assert info.value.field == "modalities[1]"


def test_oversized_input_audio_is_413() -> None:
    data = base64.b64encode(b"\0" * 2000).decode()
    content = [{"type": "input_audio", "input_audio": {"data": data, "format": "pcm16"}}]
    with pytest.raises(PayloadTooLarge) as caught:
        parse_chat_request(body(messages=[{"role": "user", "content": content}]), BOTH, Limits(max_audio_bytes=1999))
    assert caught.value.field == "messages[0].content[0].input_audio.data"
    parse_chat_request(body(messages=[{"role": "user", "content": content}]), BOTH, Limits(max_audio_bytes=2000))


def test_openai_voice_names_mean_the_default_voice() -> None:
    assert parse_chat_request(body(audio={"voice": "alloy", "format": "wav"}), BOTH).inputs.voice is None
    assert parse_chat_request(body(audio={"voice": "joe", "format": "wav"}), BOTH).inputs.voice == "joe"


def test_no_tools_and_tool_choice_none_are_accepted() -> None:
    parsed = parse_chat_request(body(tools=[], tool_choice="none"), BOTH)
    assert parsed.inputs.messages


@pytest.mark.parametrize(
    ("extra", "message", "field"),
    [
        ({"temperature": "hot"}, "temperature: expected a number, got 'hot'", "temperature"),
        ({"top_p": "x"}, "top_p: expected a number, got 'x'", "top_p"),
        ({"max_tokens": True}, "max_tokens: expected an integer, got True", "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens: must be >= 1, got 0", "max_completion_tokens"),
        ({"top_k": -1}, "top_k: must be >= 0, got -1", "top_k"),
        ({"top_k": "x"}, "top_k: expected an integer, got 'x'", "top_k"),
        ({"seed": 1.5}, "seed: expected an integer, got 1.5", "seed"),
        ({"stop": 5}, "stop: expected a non-empty string or a list of them, got 5", "stop"),
        ({"n": 2}, "'n' must be 1 (one choice per request), got 2", "n"),
        ({"modalities": []}, "'modalities' must name at least one output", "modalities"),
        ({"audio": "mp3"}, "'audio' must be an object with 'voice' and 'format', got str", "audio"),
        ({"audio": {"format": 5}},
         "'audio.format' a JSON int is not supported; this server produces wav, pcm16, mp3, opus, aac, flac", "audio.format"),
        ({"audio": {"voice": 5}}, "'audio.voice' must be a string, got int", "audio.voice"),
        ({"tools": [1]}, "'tools': this topology cannot call tools (no stage produces tool calls); send the request "
         "without them", "tools"),
        ({"model": 5}, "'model' must be a string, got int", "model"),
    ],
)
def test_each_refusal_is_one_sentence_naming_the_field(extra: dict[str, object], message: str, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body(**extra), BOTH)
    assert (str(info.value), info.value.field) == (message, field)


def test_a_body_that_is_not_an_object_is_refused_naming_the_body() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request([1], BOTH)  # type: ignore[arg-type]
    assert (str(info.value), info.value.field) == ("'body' must be a JSON object, got list", "body")


@pytest.mark.parametrize(
    ("extra", "sampling"),
    [
        ({"max_completion_tokens": 5, "max_tokens": 9}, {"max_tokens": 5}),  # the newer name wins
        ({"max_tokens": 9}, {"max_tokens": 9}),
        ({"top_k": 3}, {"top_k": 3}),
        ({"seed": 7}, {"seed": 7}),
        ({"stop": "end"}, {"stop": ("end",)}),
        ({"n": 1}, {"max_tokens": None}),
    ],
)
def test_sampling_fields_reach_the_request(extra: dict[str, object], sampling: dict[str, object]) -> None:
    parsed = parse_chat_request(body(**extra), BOTH).inputs.sampling
    assert {key: getattr(parsed, key) for key in sampling} == sampling


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"frequency_penalty": 1e308}, "frequency_penalty"),
        ({"presence_penalty": float("-inf")}, "presence_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"min_p": 2}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": True, "top_logprobs": 10**9}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": "yes"}, "logprobs"),
        ({"logit_bias": {"50256": 101}}, "logit_bias.50256"),
        ({"logit_bias": {"the": 1}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"colour": "blue"}, "colour"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ],
)
def test_fields_once_accepted_and_ignored_are_refused_by_name(extra: dict[str, object], field: str) -> None:
    """Issue 40 bug 7: these were accepted and did nothing; out of OpenAI's ranges, or not
    a field this server takes, each is a 400 naming the field."""
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body(**extra), BOTH)
    assert info.value.field == field and field in str(info.value)


def test_every_sampling_field_reaches_the_one_sampling_type() -> None:
    """OpenAI's fields and the vLLM/SGLang extensions (top_k, min_p, repetition_penalty,
    seed) land in the request's sampling, where the stage honours or refuses them."""
    req = parse_chat_request(body(logprobs=True, top_logprobs=2, logit_bias={"5": -100, "7": 2.5}, frequency_penalty=0.5,
                                  presence_penalty=-2, top_k=0, min_p=0.1, repetition_penalty=1.1, seed=3,
                                  max_completion_tokens=4, user="u1", stream_options={"include_usage": True},
                                  stream=True), BOTH)
    assert req.inputs.sampling == SamplingParams(
        max_tokens=4, top_k=0, min_p=0.1, seed=3, frequency_penalty=0.5, presence_penalty=-2.0, repetition_penalty=1.1,
        logit_bias={5: -100.0, 7: 2.5}, logprobs=True, top_logprobs=2)
    assert req.inputs.params()["sampling"]["logit_bias"] == {5: -100.0, 7: 2.5}
