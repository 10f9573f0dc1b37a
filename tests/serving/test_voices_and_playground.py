"""``GET /v1/audio/voices`` (the voices the topology's TTS factory lists, OpenAI's names as
aliases) and ``GET /`` (the playground page), in the test process against a scripted
pipeline over a real topology whose factory module sits beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from omnictl.serving.app import create_app
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.speech.voices import installed_voices
from omnictl.serving.state import ServingState
from omnictl.topology.validation import load
from tests.serving.scripted import CHAT_ONLY, EVERY_ENDPOINT, ScriptedPipeline

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


def voiced(tmp_path: Path, voices: str = '["nora", "amy", "bob"]', module: str = "voiced") -> Any:
    """A topology whose TTS factory (in a module beside it) lists ``voices``."""
    (tmp_path / f"{module}.py").write_text(
        f"def front():\n    return lambda data: data\n\n\n"
        f"def text():\n    return lambda data: data\n\n\n"
        f"def tts():\n    return lambda data: data\n\n\ntts.voices = lambda: {voices}\n"
    )
    (tmp_path / f"{module}.yaml").write_text(
        f"name: {module}\nstages:\n"
        f"  - name: front\n    factory: {module}.front\n    next: [answer, speak]\n"
        f"  - name: answer\n    factory: {module}.text\n    terminal: true\n    modality: text\n"
        f"  - name: speak\n    factory: {module}.tts\n    terminal: true\n    modality: audio\n"
    )
    return load(tmp_path / f"{module}.yaml")


def serve(pipeline: ScriptedPipeline | None) -> TestClient:
    return TestClient(
        create_app(ServingState(model_name="m", pipeline=pipeline, api_key=KEY)), base_url="http://localhost"
    )


def test_the_voices_are_the_factory_s_sorted_with_openai_s_names_as_aliases(tmp_path: Path) -> None:
    response = serve(ScriptedPipeline(topology=voiced(tmp_path))).get("/v1/audio/voices", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [{"id": name, "object": "voice", "name": name} for name in ("amy", "bob", "nora")],
        "aliases": sorted(OPENAI_VOICES),
    }


def test_only_an_audio_terminal_s_voices_count(tmp_path: Path) -> None:
    assert installed_voices(voiced(tmp_path)) == ["amy", "bob", "nora"]
    assert installed_voices(EVERY_ENDPOINT) is None  # its speak factory lists none
    assert installed_voices(CHAT_ONLY) is None


def test_voices_are_behind_the_key_and_wait_for_the_pipeline(tmp_path: Path) -> None:
    client = serve(ScriptedPipeline(topology=voiced(tmp_path)))
    for headers in ({}, {"Authorization": "Bearer nope"}):
        unauthorized = client.get("/v1/audio/voices", headers=headers)
        assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "invalid_api_key"
    starting = serve(None).get("/v1/audio/voices", headers=AUTH)
    assert starting.status_code == 503
    assert starting.json()["error"] == {
        "message": "the server is starting",
        "type": "server_error",
        "code": "starting",
        "param": None,
    }


def test_a_topology_whose_factory_lists_no_voices_is_404_saying_what_is_missing() -> None:
    response = serve(ScriptedPipeline(topology=EVERY_ENDPOINT)).get("/v1/audio/voices", headers=AUTH)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"] == (
        f"topology {EVERY_ENDPOINT.name!r} does not list its voices (no audio terminal whose factory "
        "has a 'voices' attribute)"
    )
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")


@pytest.mark.parametrize("listed", ["(1, 2)", "iter(['z', 'y'])"])
def test_voice_names_are_strings_whatever_the_factory_returns(tmp_path: Path, listed: str) -> None:
    voices = installed_voices(voiced(tmp_path, listed, module=f"voiced_{len(listed)}"))
    assert voices == (["1", "2"] if listed == "(1, 2)" else ["y", "z"])


def test_the_playground_is_one_page_never_cached() -> None:
    response = serve(None).get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    page = response.text
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "/v1/realtime/calls" in page and "/v1/realtime" in page  # WebRTC, and the WebSocket fallback
    # nothing fetched from elsewhere: no script, style or image from another origin
    for attribute in ('src="http', "src='http", 'href="http', "href='http", "@import"):
        assert attribute not in page, attribute
