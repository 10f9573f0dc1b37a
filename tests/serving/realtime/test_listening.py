"""The served topology listens (issue 46, Build 2): a realtime session on the voice assistant
transcribes each turn while it is spoken through the served pipeline itself (a streaming-input
request of the ``transcript`` modality), with no live transcriber given, and the early answer at
a pause starts from that live transcript: the turn's live request is asked for the transcript
so far (only its tail is decoded there), and no audio is sent to be recognised again.

In the test process: the session object fed decoded client events; the pipeline is the scripted
one with the voice assistant's real topology, its streamed requests the live-request double of
``test_live_transcription`` (a word per 100 ms of audio; the words so far when asked). Real
Whisper in one stage for both kinds of request is ``tests/models/voice_assistant/test_asr_stream.py``;
a real server is ``test_realtime_turns.py``."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.inputs import AudioPart, ChatRequest
from omnictl.outputs import Transcript
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime import vad
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.realtime.session.context import listens
from omnictl.serving.state import ServingState
from omnictl.topology.validation import load
from tests.serving.realtime.test_live_transcription import LiveRequest, LiveTranscriber
from tests.serving.realtime.test_turn_shell import ScriptedVoice
from tests.serving.scripted import CHAT_ONLY, EVERY_ENDPOINT, ScriptedPipeline, ScriptedRequest, text_events

VOICE_ASSISTANT = load(Path(__file__).resolve().parents[3] / "topologies" / "voice-assistant.yaml")
RATE = 24_000


class ListeningPipeline(ScriptedPipeline):
    """The scripted pipeline with the voice assistant's topology: a streamed input goes to the
    live-request double; a whole transcription answers "whole decode" and counts the samples
    it was sent (what the old early answer sent again at every pause)."""

    def __init__(self) -> None:
        super().__init__(topology=VOICE_ASSISTANT, script=self._answer)
        self.live = LiveTranscriber()
        self.recognised_samples = 0

    def _answer(self, inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        if modalities == ["transcript"]:
            assert isinstance(inputs, ChatRequest)
            self.recognised_samples += sum(
                p.samples.size for m in inputs.messages for p in m.parts if isinstance(p, AudioPart) and p.samples is not None
            )
            return [RequestEvent(RequestEventKind.RESULT, "transcript", Transcript(text="whole decode"))]
        return text_events(["an", "answer"], stage="decode")

    async def submit(self, inputs: Any, modalities: list[str] | None = None, request_id: str | None = None,  # type: ignore[override]
                     traceparent: str | None = None, stream: bool = True,
                     input_stream: bool = False) -> ScriptedRequest | LiveRequest:
        if input_stream:
            return await self.live.submit(inputs, modalities, request_id, traceparent, stream, input_stream)
        return await super().submit(inputs, modalities, request_id, traceparent, stream)

    async def abort(self, request_id: str) -> None:
        await self.live.abort(request_id)
        await super().abort(request_id)


def session_on(pipeline: ListeningPipeline) -> tuple[RealtimeSession, list[dict[str, Any]]]:
    state = ServingState(model_name="voice-assistant", pipeline=pipeline)  # type: ignore[arg-type]  # no live transcriber
    assert state.live_transcriber is None
    sent: list[dict[str, Any]] = []
    session = RealtimeSession(state, pipeline, lambda e: sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                              "voice-assistant", silero=lambda: None)  # type: ignore[arg-type,return-value]
    return session, sent


async def append(session: RealtimeSession, seconds: float, level: int = 1000) -> None:
    audio = np.full(int(seconds * RATE), level, "<i2").tobytes()
    await session.handle(ev.decode_client_event(json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})))
    for _ in range(5):
        await asyncio.sleep(0)  # the live request's task sends it on


async def settle(session: RealtimeSession) -> None:
    while session._tasks:
        await asyncio.gather(*list(session._tasks), return_exceptions=True)


def test_only_the_voice_assistant_listens() -> None:
    assert listens(VOICE_ASSISTANT)
    assert not listens(EVERY_ENDPOINT) and not listens(CHAT_ONLY)  # a topology whose asr takes no stream


def test_transcription_deltas_come_while_speaking_by_default_through_the_served_pipeline() -> None:
    async def scenario() -> None:
        pipeline = ListeningPipeline()
        session, sent = session_on(pipeline)  # the session as created: its defaults
        assert session.settings.transcription  # deltas on, no setting asked for
        session.settings.vad = None  # manual turns: the turn opens with its first audio
        session._reset_vad()
        for _ in range(3):
            await append(session, 0.1)
        deltas = [e["delta"] for e in sent if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert deltas == ["w0", " w1", " w2"]  # before the commit: the turn is still being spoken
        await session.handle(ev.decode_client_event(json.dumps({"type": "input_audio_buffer.commit"})))
        await settle(session)
        [completed] = [e for e in sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
        assert completed["transcript"] == "w0 w1 w2 end"
        [live] = pipeline.live.requests  # the served pipeline's streamed request: no second pipeline
        assert live.ended and pipeline.recognised_samples == 0 and pipeline.submitted == []
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_early_answer_starts_from_the_live_transcript_and_sends_no_audio_to_recognise() -> None:
    """The pause's answer: before, the whole buffer went to a second recognition request (and
    with a live transcriber there was no early answer at all); now the live request is asked
    for the transcript so far, which is the answer's, then the turn's, and nothing is sent again."""

    async def scenario() -> None:
        pipeline = ListeningPipeline()
        session, sent = session_on(pipeline)
        session.settings.output_modalities = ["text"]
        voice = ScriptedVoice([(200, vad.SpeechStarted(200)), (1200, vad.SpeechPaused(1200)),
                               (1500, vad.SpeechStopped(1200))])  # ends where it paused: the early answer is used
        session.listener.frontend.speech = voice  # type: ignore[assignment]  # the scripted source hears
        session.listener.turns = voice  # type: ignore[assignment]
        for n in range(20):
            await append(session, 0.1, level=1000 if n < 12 else 0)  # speech, then silence from the pause on
            if session.response is not None:
                await asyncio.shield(session.response[1])
        await settle(session)
        types = [e["type"] for e in sent]
        [live] = pipeline.live.requests
        assert live.tentatives == 1  # asked once, at the pause
        assert pipeline.recognised_samples == 0  # no audio sent to be recognised again
        [(request, modalities, *_)] = pipeline.submitted  # the answer, and nothing else
        said = [p.text for m in request.messages for p in m.parts if hasattr(p, "text")]
        [completed] = [e for e in sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
        deltas = [e["delta"] for e in sent if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert said[-1] == completed["transcript"] == "".join(deltas)  # what it heard is the turn's transcript
        assert completed["transcript"] == " ".join(f"w{n}" for n in range(12))  # its 1.2 s of speech
        assert "end" not in completed["transcript"]  # not the live request's final: its input never ended
        assert types.index("input_audio_buffer.committed") < types.index("response.created")
        assert session.state.metrics.preemptive.labels("used")._value.get() == 1
        assert live.id in pipeline.live.aborts and not live.ended  # not needed once the answer heard it
        assert not session.state.active
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
