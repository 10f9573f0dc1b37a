"""A chat answer's logprobs in OpenAI's shape (``choices[].logprobs.content``), checked with
the official ``openai`` client's types, whole and streamed; a stage's refusal of a sampling
field is a 400 naming the field as the body does. In the test process, against a scripted
pipeline: the stage side is tests/schedulers/test_vllm_sampling.py."""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from starlette.testclient import TestClient

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import TextDelta, TextResult, TokenLogprob, TopLogprob
from omnictl.serving.app import create_app
from omnictl.serving.state import ServingState
from tests.serving.scripted import CHAT_ONLY, ScriptedPipeline, error_event

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
ASK = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 1}
LOGPROBS = [
    TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top_logprobs=[TopLogprob(token="Hi", logprob=-0.5, bytes=[72, 105])]),
    TokenLogprob(token="!", logprob=-1.25, bytes=[33], top_logprobs=[TopLogprob(token=".", logprob=-0.75, bytes=[46])]),
]


def answered(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
    return [
        RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("Hi")),
        RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("!")),
        RequestEvent(RequestEventKind.RESULT, "answer",
                     TextResult("Hi!", prompt_tokens=3, completion_tokens=2, logprobs=LOGPROBS)),
    ]


def client_for(pipeline: ScriptedPipeline) -> TestClient:
    return TestClient(create_app(ServingState(model_name="m", pipeline=pipeline, api_key=KEY)), base_url="http://localhost")


def test_a_whole_answer_carries_its_logprobs_in_openais_shape() -> None:
    response = client_for(ScriptedPipeline(topology=CHAT_ONLY, script=answered)).post(
        "/v1/chat/completions", headers=AUTH, json=ASK)
    assert response.status_code == 200, response.text
    completion = ChatCompletion.model_validate(response.json())
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [(t.token, t.logprob, t.bytes) for t in logprobs.content] == [("Hi", -0.5, [72, 105]), ("!", -1.25, [33])]
    assert [[(a.token, a.logprob) for a in t.top_logprobs] for t in logprobs.content] == [[("Hi", -0.5)], [(".", -0.75)]]
    plain = client_for(ScriptedPipeline(topology=CHAT_ONLY)).post(
        "/v1/chat/completions", headers=AUTH, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert "logprobs" not in plain.json()["choices"][0]  # not asked for: not there


def test_a_streamed_answer_carries_them_in_its_last_chunk() -> None:
    response = client_for(ScriptedPipeline(topology=CHAT_ONLY, script=answered)).post(
        "/v1/chat/completions", headers=AUTH, json={**ASK, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [ChatCompletionChunk.model_validate(json.loads(block[len("data: "):]))
              for block in response.text.split("\n\n") if block.startswith("data: {")]
    content = [t for c in chunks for choice in c.choices if choice.logprobs and choice.logprobs.content
               for t in choice.logprobs.content]
    assert [t.token for t in content] == ["Hi", "!"]
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].logprobs is not None


def test_a_field_the_stage_cannot_honour_is_a_400_naming_it_as_the_body_does() -> None:
    refused = error_event("stage 'answer': sampling.logprobs: the HF runner cannot honour this field",
                          field="sampling.logprobs")
    for stream in (False, True):
        response = client_for(ScriptedPipeline(topology=CHAT_ONLY, script=lambda inputs, modalities: [refused])).post(
            "/v1/chat/completions", headers=AUTH, json={**ASK, "stream": stream})
        if stream:
            error = next(json.loads(b[len("data: "):]) for b in response.text.split("\n\n") if '"error"' in b)["error"]
        else:
            assert response.status_code == 400
            error = response.json()["error"]
        assert error["param"] == "logprobs" and "cannot honour" in error["message"]
