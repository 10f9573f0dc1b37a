"""The HTTP input path in process: one decode of input audio from the body to the entry
stage, the typed request submitted, and large bodies parsed off the event loop."""

from __future__ import annotations

import base64
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

import omnictl.inputs
from omnictl.admission import Admission
from omnictl.exceptions import PipelineDead
from omnictl.inputs import AudioPart, ChatRequest
from omnictl.models.voice_assistant.stages import prepare_question
from omnictl.serving.app import ServingState, create_app
from omnictl.serving.chat.protocol import INLINE_PARSE_BYTES
from omnictl.transports.packing import pack, unpack
from tests.serving import fast_stages
from tests.test_inputs import tone, wav_bytes


class RecordingPipeline:
    """Enough of a Pipeline for the input path: records each submit (and the thread it ran
    on, the event loop's), then refuses the request so that no answer is needed."""

    run_dir = None
    healthy = True

    def __init__(self) -> None:
        self.topology = SimpleNamespace(terminals={"answer": "text"})
        self.admission = Admission(max_in_flight=None)  # the server asks it before reading a body
        self.submitted: list[tuple[Any, list[str] | None, int]] = []

    async def submit(self, inputs: Any, modalities: list[str] | None = None, request_id: str | None = None,
                     traceparent: str | None = None, stream: bool = True) -> Any:
        self.submitted.append((inputs, modalities, threading.get_ident()))
        raise PipelineDead("test pipeline: stops at submit")


@pytest.fixture()
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every base64 decode and WAV read from here on, anywhere, with the thread it ran on."""
    calls: list[tuple[str, int]] = []
    b64decode, read_wav = base64.b64decode, omnictl.inputs.read_wav

    def counted_b64decode(*args: Any, **kwargs: Any) -> bytes:
        calls.append(("b64decode", threading.get_ident()))
        return b64decode(*args, **kwargs)

    def counted_read_wav(*args: Any, **kwargs: Any) -> Any:
        calls.append(("read_wav", threading.get_ident()))
        return read_wav(*args, **kwargs)

    monkeypatch.setattr(base64, "b64decode", counted_b64decode)
    monkeypatch.setattr(omnictl.inputs, "read_wav", counted_read_wav)
    return calls


def post_audio(pipeline: RecordingPipeline, wav: bytes, fmt: str = "wav") -> None:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": fmt}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "listen"}, part]}],
            "max_tokens": 7, "audio": {"voice": "joe"}}
    with TestClient(create_app(ServingState(model_name="m", pipeline=pipeline)), base_url="http://localhost") as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503 and response.json()["error"]["code"] == "pipeline_dead"


def test_input_audio_is_decoded_once_from_the_body_to_the_entry_stage(decodes: list[tuple[str, int]]) -> None:
    samples = tone()
    pipeline = RecordingPipeline()
    post_audio(pipeline, wav_bytes(samples))
    [(inputs, modalities, _)] = pipeline.submitted
    assert [name for name, _ in decodes] == ["b64decode", "read_wav"]
    # the typed request is what the pipeline gets, with the sampling and voice inside it
    assert isinstance(inputs, ChatRequest) and modalities == ["text"]
    assert inputs.sampling.max_tokens == 7 and inputs.voice == "joe"
    [audio] = inputs.last_user_message().audio()
    np.testing.assert_allclose(audio.samples, samples, atol=1 / 16000)

    # The coordinator sends it to the entry stage's process; the entry stages decode nothing.
    packed = pack(inputs)
    arrived = unpack(packed.skeleton, packed.layout, packed.to_bytes())
    assert fast_stages.prep()(arrived)["words"][:2] == ["echo:", "listen"]
    spoken = prepare_question(arrived)["audio"]
    assert [value.size for value in spoken.values()] == [samples.size]  # 16 kHz in, 16 kHz out
    assert len(decodes) == 2


def test_a_small_body_is_parsed_on_the_loop_and_a_large_one_off_it(decodes: list[tuple[str, int]]) -> None:
    small, large = np.zeros(1000, "<i2").tobytes(), np.zeros(INLINE_PARSE_BYTES // 2 + 1, "<i2").tobytes()
    pipeline = RecordingPipeline()
    post_audio(pipeline, small, "pcm16")
    post_audio(pipeline, large, "pcm16")
    (_, _, loop_small), (inputs, _, loop_large) = pipeline.submitted
    (_, decoded_small), (_, decoded_large) = decodes
    assert decoded_small == loop_small  # inline: a thread hop would cost more than the parse
    assert decoded_large != loop_large  # a worker thread: the loop kept serving meanwhile
    assert isinstance(inputs.messages[0].parts[1], AudioPart)
    assert inputs.messages[0].parts[1].samples.size == INLINE_PARSE_BYTES // 2 + 1


def test_a_bad_large_body_is_still_a_400_naming_the_part() -> None:
    data = base64.b64encode(bytes(INLINE_PARSE_BYTES)).decode()[:-4] + "@@@@"  # parsed in a worker thread
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "pcm16"}}
    body = {"messages": [{"role": "user", "content": [part]}]}
    pipeline = RecordingPipeline()
    with TestClient(create_app(ServingState(model_name="m", pipeline=pipeline)), base_url="http://localhost") as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and pipeline.submitted == []
    assert response.json()["error"]["param"] == "messages[0].content[0].input_audio.data"
