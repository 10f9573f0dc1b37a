"""The whole voice assistant, as `omnictl serve` runs it: real processes, real models.

A spoken "What is the capital of France?" must come back as text containing "Paris"
and as speech in which the same Whisper model hears "Paris".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import omnictl
from benchmarks.eval.samples import sample_request
from omnictl.coordinator.request import RequestEventKind
from omnictl.inputs import ChatRequest, parse_request
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from omnictl.outputs import AudioChunk, AudioResult, FinishReason, TextDelta, TextResult, Transcript
from tests.support.loop import LoopThread

# Longer than the suite's default deadline: the real voice-assistant models loaded (the shared
# launch, paid by whichever module comes first), a vLLM engine start-up among them; at a load of
# 15-20 on the 2-core machine the launch alone took minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the real voice assistant end to end


@pytest.fixture
def pipeline(voice_assistant: tuple[LoopThread, Any]) -> tuple[LoopThread, Any]:
    """The package's one launch of the embedded voice assistant (conftest.py), which
    test_answer_quality.py asks too."""
    return voice_assistant


async def ask(pipe: Any, inputs: ChatRequest | dict[str, Any], modalities: list[str] | None = None) -> tuple[list[Any], dict[str, Any]]:
    request = await pipe.submit(inputs, modalities=modalities)
    events = [event async for event in request.events()]
    return events, await request.result()


def test_a_spoken_question_gets_a_written_and_a_spoken_answer(pipeline: tuple[LoopThread, Any]) -> None:
    loop, pipe = pipeline
    events, result = loop.run(ask(pipe, sample_request("capital_of_france", sampling={"max_tokens": 40})), timeout=300)
    assert set(result) == {"transcript", "decode", "tts"}
    assert isinstance(result["transcript"], Transcript) and "France" in result["transcript"].text
    text = result["decode"]
    assert isinstance(text, TextResult)
    assert "Paris" in text.text
    assert text.prompt_tokens > 0 and text.completion_tokens > 0 and text.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    text_chunks = [e.data for e in events if e.stage == "decode" and e.kind is RequestEventKind.STREAM]
    assert all(isinstance(d, TextDelta) for d in text_chunks)
    assert "".join(d.text for d in text_chunks) == text.text

    speech = result["tts"]
    assert isinstance(speech, AudioResult)
    assert speech.sample_rate == 22_050 and speech.samples.dtype == np.float32
    chunks = [e.data for e in events if e.stage == "tts" and e.kind is RequestEventKind.STREAM]
    assert all(isinstance(c, AudioChunk) and not isinstance(c, AudioResult) for c in chunks)
    assert chunks and np.array_equal(np.concatenate([c.samples for c in chunks]), speech.samples)
    assert " ".join(c.transcript for c in chunks) == speech.transcript
    heard = SpeechRecognizer().transcribe(speech.samples, speech.sample_rate)
    assert "paris" in heard.lower(), heard

    kinds = [(e.stage, e.kind) for e in events]
    assert kinds.index(("decode", RequestEventKind.STREAM)) < kinds.index(("tts", RequestEventKind.STREAM))  # text arrives before audio


def test_a_typed_question_for_text_only_skips_speech(pipeline: tuple[LoopThread, Any]) -> None:
    loop, pipe = pipeline
    inputs = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "sampling": {"max_tokens": 24, "temperature": 0}}
    events, result = loop.run(ask(pipe, inputs, modalities=["text"]), timeout=300)
    assert set(result) == {"decode"} and isinstance(result["decode"], TextResult) and "Paris" in result["decode"].text
    assert all(e.stage != "tts" for e in events)


def test_a_bad_part_fails_the_request_naming_the_part(pipeline: tuple[LoopThread, Any]) -> None:
    loop, pipe = pipeline
    inputs = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}]}
    with pytest.raises((omnictl.RequestFailed, omnictl.InvalidRequest), match=r"messages\[0\]\.content\[0\]\.input_audio\.data"):
        loop.run(ask(pipe, inputs), timeout=120)
    assert pipe.healthy


def test_the_servers_typed_request_is_answered_with_its_sampling(pipeline: tuple[LoopThread, Any]) -> None:
    # What `omnictl serve` submits: the parsed request. Its sampling reaches the thinker's
    # scheduler through the request's params, so max_tokens=3 caps the answer.
    loop, pipe = pipeline
    typed = parse_request({"messages": [{"role": "user", "content": "Name three colours."}], "sampling": {"max_tokens": 3, "temperature": 0}})
    _, result = loop.run(ask(pipe, typed, modalities=["text"]), timeout=300)
    answer = result["decode"]
    assert isinstance(answer, TextResult)
    assert answer.completion_tokens == 3 and answer.finish_reason is FinishReason.LENGTH


def test_the_requests_speed_reaches_piper_and_the_same_answer_is_spoken_faster(pipeline: tuple[LoopThread, Any]) -> None:
    # A realtime session's audio.output.speed arrives as the chat request's speed; greedy
    # sampling gives the same words both times, so only the speaking pace differs.
    loop, pipe = pipeline
    inputs = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "sampling": {"max_tokens": 16, "temperature": 0}}
    spoken = {}
    for speed in (1.0, 2.0):
        _, result = loop.run(ask(pipe, {**inputs, "speed": speed}), timeout=300)
        speech = result["tts"]
        assert isinstance(speech, AudioResult)
        spoken[speed] = speech
    assert spoken[1.0].transcript == spoken[2.0].transcript and "Paris" in spoken[2.0].transcript
    ratio = spoken[2.0].samples.size / spoken[1.0].samples.size
    assert 0.4 < ratio < 0.65, ratio  # Piper's phonemes take half as long; its pauses shrink too
