"""Integers past what the server carries, through the chat route against a scripted
pipeline: a JSON 400 naming the field and counted as rejected, never a plain-text 500."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from omnictl.serving.app import create_app
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("key", [str(2**64), str(2**64 - 1), str(2**31), "9" * 5000, str(-(2**64))])
def test_a_logit_bias_key_past_a_token_id_is_a_400_naming_the_field(key: str) -> None:
    # Before: 2^64 and up passed the check (a 200 from this scripted pipeline; a real one
    # failed encoding the request for its stage in msgpack: an ASGI traceback, a plain-text
    # 500 counted in no outcome), and a key of 5,000 digits made int() itself raise (a 500 here).
    pipeline = ScriptedPipeline()
    state = ServingState(model_name="m", pipeline=pipeline, api_key=KEY)
    client = TestClient(create_app(state), base_url="http://localhost", raise_server_exceptions=False)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {key: 1}}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "logit_bias"
    assert error["message"].startswith("logit_bias: keys must be token ids (integers 0 to 2147483647), got ")
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1
