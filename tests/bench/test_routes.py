"""The bench on the speech and transcription routes: the route picked from what a server
serves (or --route, checked against it), and each route's requests timed against the real
app in process on a scripted pipeline (httpx's ASGI transport; no sockets, no model)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import httpx
import pytest
from rich.console import Console

from omnictl.bench.report import build_result, render
from omnictl.bench.runner import BenchConfig, BenchError, _drive, resolve_route
from omnictl.bench.stats import RequestRecord
from omnictl.bench.workload import pick_route, tone_wav, wav_seconds
from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.inputs import SpeechRequest
from omnictl.outputs import Transcript, TranscriptSegment
from omnictl.serving.app import create_app
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline, audio_events

KEY = "sk-bench"
CHAT = ["/v1/chat/completions", "/v1/realtime"]
SPEECH = ["/v1/audio/speech"]
HEARING = ["/v1/audio/transcriptions", "/v1/audio/translations"]


def test_the_route_comes_from_what_the_server_serves() -> None:
    assert pick_route(CHAT) == "chat"  # Qwen3-Omni, Qwen2.5-Omni
    assert pick_route(CHAT + SPEECH + HEARING) == "chat"  # the voice assistant: a chat server that also speaks
    assert pick_route(CHAT + SPEECH) == "speech"  # CSM, Higgs Audio: a speech synthesizer
    assert pick_route(["/v1/realtime", *HEARING]) == "transcriptions"  # Qwen3-ASR
    assert pick_route(None) == "chat"  # a server that does not list its routes
    with pytest.raises(ValueError, match=r"serves /v1/realtime \(a full-duplex model such as Moshi .*/moshi_duplex.py"):
        pick_route(["/v1/realtime"])  # Moshi


def test_a_route_asked_for_must_be_served_and_known() -> None:
    assert resolve_route("chat", CHAT + SPEECH) == "chat"  # CSM's chat completions with audio out, on request
    assert resolve_route("speech", None) == "speech"  # the server does not say: sent as asked
    with pytest.raises(BenchError, match=r"--route transcriptions: the server does not serve /v1/audio/transcriptions"):
        resolve_route("transcriptions", CHAT)
    with pytest.raises(BenchError, match=r"--route must be one of chat, speech, transcriptions, got 'tts'"):
        BenchConfig(route="tts").check()


def drive(pipeline: ScriptedPipeline, route: str, **config: Any) -> list[RequestRecord]:
    app = create_app(ServingState(model_name="m", pipeline=pipeline, api_key=KEY))
    settings = BenchConfig(url="http://localhost", num_requests=3, warmup=1, api_key=KEY, **config)
    transport = httpx.ASGITransport(app=app)
    records, duration = asyncio.run(_drive(settings, "http://localhost", None, "m", route, transport))
    assert duration > 0
    return records


def test_speech_requests_are_timed_by_their_audio() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(chunks=3, seconds=0.05))
    records = drive(pipeline, "speech", max_tokens=40)
    assert [r.ok for r in records] == [True] * 3, [r.error for r in records]
    spoken = [inputs for inputs, *_ in pipeline.submitted]
    assert all(isinstance(s, SpeechRequest) for s in spoken) and len(spoken) == 4  # the warm-up's too
    assert {s.text for s in spoken[1:]} >= {"What is the capital of France?"}  # the questions, spoken
    for record in records:
        # three 50 ms tones, as pcm16 at 24 kHz: 0.15 s of audio, timed on the receive clock
        assert record.audio_seconds == pytest.approx(0.15, abs=1 / 24_000)
        assert 0 < record.ttfa <= record.last_audio <= record.e2e  # type: ignore[operator]
        assert record.rtf == pytest.approx(record.last_audio / record.audio_seconds)  # type: ignore[operator]
        assert record.request_id and record.ttft is None


def transcribed(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
    segments = [TranscriptSegment(id=i, start=0.0, end=1.0, text=text) for i, text in enumerate([" one", " two"])]
    return [
        RequestEvent(RequestEventKind.STREAM, "hear", Transcript(text=" one", segments=segments[:1])),
        RequestEvent(RequestEventKind.STREAM, "hear", Transcript(text=" two", segments=segments[1:])),
        RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="one two", duration=1.0, segments=segments)),
    ]


def test_transcriptions_are_timed_by_their_deltas_and_the_audio_heard(tmp_path: Any) -> None:
    clip = tmp_path / "clip.wav"
    clip.write_bytes(tone_wav(1.5))
    pipeline = ScriptedPipeline(script=transcribed)
    records = drive(pipeline, "transcriptions", audio_file=str(clip))
    assert [r.ok for r in records] == [True] * 3, [r.error for r in records]
    assert all(inputs.recognition.stream for inputs, *_ in pipeline.submitted)  # asked with stream=true
    for record in records:
        assert record.output_tokens == 2 and len(record.itl) == 1  # two deltas
        assert record.input_seconds == wav_seconds(clip.read_bytes()) == 1.5
        assert 0 < record.ttft <= record.e2e  # type: ignore[operator]
        assert record.rtf == pytest.approx(record.e2e / 1.5)  # type: ignore[operator]
        assert record.audio_seconds == 0 and record.ttfa is None
    # the report: the route, and no request counted as silent (none asked for audio)
    result = build_result({"target": "t", "route": "transcriptions", "modalities": ["text", "audio"]}, records, 1.0, None)
    assert result["summary"]["completed_without_audio"] == 0
    assert result["latency"]["rtf"]["count"] == 3 and result["latency"]["ttft"]["count"] == 3
    out = io.StringIO()
    Console(file=out, width=80).print(render(result))
    assert "/v1/audio/transcriptions (stream=true)" in out.getvalue()


def test_a_refused_transcription_is_a_failure_naming_why() -> None:
    def refused(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        return [RequestEvent(RequestEventKind.ERROR, "hear", error="no speech here", field="file")]

    # every warm-up request refused: the bench stops at once, saying the server's words
    with pytest.raises(BenchError, match=r"the server rejects the bench's requests: HTTP 400: .*no speech here"):
        drive(ScriptedPipeline(script=refused), "transcriptions")
    # refused after the warm-up: each a failure naming why
    calls: list[int] = []

    def later(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        calls.append(1)
        return transcribed(inputs, modalities) if len(calls) == 1 else refused(inputs, modalities)

    records = drive(ScriptedPipeline(script=later), "transcriptions")
    assert not any(r.ok for r in records)
    assert all("no speech here" in (r.error or "") for r in records), [r.error for r in records]
