"""A turn transcribed while it is spoken (issue 39): the session feeds its audio into a
streaming-input request of the server's live transcriber from the turn's start, sends each
confirmed word as ``conversation.item.input_audio_transcription.delta`` before the turn is
committed, and the final transcript (the deltas joined) is the turn's text: no whole-utterance
transcription request after the commit.

In the test process, as tests/serving/realtime/test_session_events.py: the session object fed
decoded client events; the live transcriber is a test double of a streaming-input pipeline (one
word per 100 ms of audio), the conversation's pipeline the scripted one. A real live
transcriber (Whisper, incrementally, in its own stage process) is the slow test at the end."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import numpy as np
import pytest

from omnictl.audio import float_to_pcm16_bytes, resample
from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.exceptions import Overloaded, RequestAborted
from omnictl.outputs import TENTATIVE, Transcript
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline, text_events

RATE = 24_000
WORD_BYTES = RATE // 10 * 2  # the double confirms a word per 100 ms of pcm16


class LiveRequest:
    """A streaming-input request: a word per 100 ms of audio sent (not silence), the rest at the end."""

    def __init__(self, rid: str) -> None:
        self.id = rid
        self.received = 0
        self.voiced = 0  # bytes of audio that are not silence
        self.ended = False
        self.words: list[str] = []
        self.queue: asyncio.Queue[RequestEvent] = asyncio.Queue()
        self.done = False
        self.tentatives = 0  # {"tentative": True} chunks answered

    async def send(self, data: Any) -> None:
        assert not self.ended
        if self.done:
            raise RequestAborted(f"request {self.id} was aborted")
        if data == {"tentative": True}:  # the transcript so far, for an early answer (issue 46)
            self.tentatives += 1
            text = " ".join(self.words)
            self.queue.put_nowait(RequestEvent(RequestEventKind.STREAM, "live", Transcript(text=text, task=TENTATIVE)))
            return
        assert isinstance(data, bytes)
        self.received += len(data)
        before = self.voiced // WORD_BYTES
        self.voiced += 2 * int(np.count_nonzero(np.frombuffer(data, "<i2")))  # silence says no words
        for n in range(before, self.voiced // WORD_BYTES):
            self._word(f"w{n}")

    def _word(self, word: str) -> None:
        delta = word if not self.words else " " + word
        self.words.append(word)
        self.queue.put_nowait(RequestEvent(RequestEventKind.STREAM, "live", Transcript(text=delta)))

    async def end_input(self) -> None:
        self.ended = True
        self._word("end")
        text = " ".join(self.words)
        self.queue.put_nowait(RequestEvent(RequestEventKind.RESULT, "live", Transcript(text=text, duration=1.0)))
        self.done = True

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self.queue.put_nowait(RequestEvent(RequestEventKind.ABORTED, None))

    async def events(self) -> AsyncIterator[RequestEvent]:
        while True:
            event = await self.queue.get()
            yield event
            if event.kind is not RequestEventKind.STREAM:
                return


class LiveTranscriber:
    """The test double of a pipeline whose entry takes a streamed input."""

    topology = None
    healthy = True
    run_dir = None

    def __init__(self) -> None:
        self.requests: list[LiveRequest] = []
        self.aborts: list[str] = []
        self.refuse: Exception | None = None

    async def submit(self, inputs: Any, modalities: list[str] | None = None, request_id: str | None = None,
                     traceparent: str | None = None, stream: bool = True, input_stream: bool = False) -> LiveRequest:
        assert input_stream and inputs is None and modalities == ["transcript"]
        if self.refuse is not None:
            raise self.refuse
        request = LiveRequest(request_id or "live")
        self.requests.append(request)
        return request

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)
        for request in self.requests:
            if request.id == request_id:
                request.abort()


class Client:
    def __init__(self, intent: str | None = None) -> None:
        self.pipeline = ScriptedPipeline(script=lambda inputs, modalities: (
            [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="whole decode"))]
            if modalities == ["transcript"] else text_events(["an", "answer"])))
        self.live = LiveTranscriber()
        self.state = ServingState(model_name="m", pipeline=self.pipeline, live_transcriber=self.live)  # type: ignore[arg-type]
        self.sent: list[dict[str, Any]] = []
        self.session = RealtimeSession(self.state, self.pipeline, lambda e: self.sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                                       "m", silero=lambda: None, intent=intent)  # type: ignore[arg-type,return-value]
        self.session.settings.vad = None  # manual turns: the turn starts with its first audio
        self.session._reset_vad()

    async def send(self, event: dict[str, Any]) -> None:
        await self.session.handle(ev.decode_client_event(json.dumps(event)))

    async def append(self, seconds: float) -> None:
        audio = np.full(int(seconds * RATE), 1000, "<i2").tobytes()
        await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
        for _ in range(5):
            await asyncio.sleep(0)  # the live request's task sends it on

    async def append_raw(self, pcm: bytes) -> None:
        await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        for _ in range(5):
            await asyncio.sleep(0)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == kind]

    def types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    async def settle(self) -> None:
        while self.session._tasks:
            await asyncio.gather(*list(self.session._tasks), return_exceptions=True)


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_deltas_come_while_the_turn_is_spoken_and_add_up_to_the_completed_transcript() -> None:
    async def scenario() -> None:
        client = Client()
        for _ in range(3):
            await client.append(0.1)
        early = [d["delta"] for d in client.of("conversation.item.input_audio_transcription.delta")]
        assert early == ["w0", " w1", " w2"]  # before any commit: the turn is still being spoken
        assert "input_audio_buffer.committed" not in client.types()
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        deltas = client.of("conversation.item.input_audio_transcription.delta")
        [completed] = client.of("conversation.item.input_audio_transcription.completed")
        [committed] = client.of("input_audio_buffer.committed")
        assert "".join(d["delta"] for d in deltas) == completed["transcript"] == "w0 w1 w2 end"
        assert {d["item_id"] for d in deltas} == {completed["item_id"], committed["item_id"]}
        # the audio went to the live request as it came, and nothing was decoded whole after the turn
        [live] = client.live.requests
        assert live.received == 3 * WORD_BYTES and live.ended
        assert client.pipeline.submitted == []
        [turn] = client.session.conversation.turns
        assert turn.text == "w0 w1 w2 end" and turn.audio is None  # the transcript stands for it
        assert client.state.active == {} and client.session._transcribing == {}

    run(scenario)


def test_the_live_transcript_is_what_the_response_hears() -> None:
    async def scenario() -> None:
        client = Client()
        await client.append(0.2)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        await client.settle()
        [(request, modalities, *_)] = client.pipeline.submitted  # the response: no transcription request
        assert "transcript" not in (modalities or [])
        said = [p.text for m in request.messages for p in m.parts if hasattr(p, "text")]
        assert said[-1] == "w0 w1 end"
        assert client.of("response.done")[0]["response"]["status"] == "completed"

    run(scenario)


def test_a_cleared_turn_aborts_its_live_request_and_the_next_turn_opens_another() -> None:
    async def scenario() -> None:
        client = Client()
        await client.append(0.2)
        await client.send({"type": "input_audio_buffer.clear"})
        await client.settle()
        first = client.live.requests[0]
        assert client.live.aborts == [first.id] and not first.ended
        assert client.state.active == {} and client.session.conversation.turns == []
        await client.append(0.1)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        assert len(client.live.requests) == 2 and client.live.requests[1].ended
        assert client.of("conversation.item.input_audio_transcription.completed")[0]["transcript"] == "w0 end"

    run(scenario)


def test_a_live_request_refused_at_the_start_leaves_the_turn_to_the_whole_decode() -> None:
    async def scenario() -> None:
        client = Client()
        client.live.refuse = Overloaded("too many requests in flight", retry_after=1)
        await client.append(0.2)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        [(_, modalities, *_)] = client.pipeline.submitted
        assert modalities == ["transcript"]
        [completed] = client.of("conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "whole decode"

    run(scenario)


def test_a_transcription_session_with_transcription_off_sends_no_deltas_but_keeps_the_text() -> None:
    async def scenario() -> None:
        client = Client()
        await client.send({"type": "session.update", "session": {"audio": {"input": {"transcription": None}}}})
        await client.append(0.2)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        assert client.of("conversation.item.input_audio_transcription.delta") == []
        assert client.session.conversation.turns[0].text == "w0 w1 end"

    run(scenario)


# --- a real live transcriber: Whisper base, incrementally, in its own stage process ------------

ASR_STREAM = Path(__file__).resolve().parents[2] / "models" / "voice_assistant" / "asr_stream.yaml"


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real server in this process (tests/serving/slow.yaml's pipeline) with a real live
    transcriber (asr_stream.yaml: Whisper base, incrementally, in its own stage process),
    launched once for the two slow tests: the first drives a session object on its live
    transcriber, the second a WebSocket client through the server."""
    from omnictl.models.voice_assistant.asr import whisper_base_dir
    from omnictl.serving.config import HttpConfig, ServeConfig
    from tests.serving.harness import serving_in_process

    whisper_base_dir()  # the cache built here, where a failure is readable
    options = ServeConfig(topology=str(Path(__file__).resolve().parents[1] / "slow.yaml"), http=HttpConfig(port=0),
                          live_transcriber=str(ASR_STREAM)).launching(run_dir=tmp_path_factory.mktemp("live-run"))
    with serving_in_process(options, "in-process omnictl serve (live transcriber)") as listening:
        yield listening


def nothing_held(live: Any, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """What the live pipeline still holds anywhere (read on its own loop): every figure zero."""
    held: dict[str, Any] = asyncio.run_coroutine_threadsafe(live.held(), loop).result(30)
    figures = [*held["coordinator"].values(), *held["admission"].values(),
               *(v for stage in held["stages"].values() for v in stage.values())]
    assert not any(figures), held
    return held


@pytest.mark.slow  # real processes and Whisper base loaded in the stage's process
@pytest.mark.timeout(300)
def test_a_spoken_question_is_transcribed_while_it_is_streamed_in_real_time(live_server: Any) -> None:
    from benchmarks.eval.quality import word_errors
    from benchmarks.eval.samples import sample_question, sample_text

    live, loop = live_server.state.live_transcriber, live_server.loop
    assert live is not None and loop is not None
    samples, rate = sample_question("capital_of_france")
    pcm = float_to_pcm16_bytes(resample(samples, rate, RATE))
    chunk = RATE // 10 * 2  # 100 ms of pcm16

    async def main() -> tuple[Client, int]:  # on the live pipeline's loop (the server's)
        client = Client()
        client.state.live_transcriber = live
        for offset in range(0, len(pcm), chunk):
            audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
            await client.send({"type": "input_audio_buffer.append", "audio": audio})
            await asyncio.sleep(0.1)  # real time
        during = len(client.of("conversation.item.input_audio_transcription.delta"))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        return client, during

    client, during = asyncio.run_coroutine_threadsafe(main(), loop).result(120)
    deltas = [d["delta"] for d in client.of("conversation.item.input_audio_transcription.delta")]
    [completed] = client.of("conversation.item.input_audio_transcription.completed")
    assert during >= 1, deltas  # words came while the question was still being spoken
    assert "".join(deltas) == completed["transcript"]
    assert word_errors(sample_text("capital_of_france"), completed["transcript"])[0] == 0, completed["transcript"]
    assert client.pipeline.submitted == []  # no whole-utterance decode after the turn
    assert client.state.active == {}
    nothing_held(live, loop)  # nothing left behind in the live pipeline


@pytest.mark.slow  # two real pipelines (Whisper base in one) behind a real server, a real WebSocket client
@pytest.mark.timeout(300)
def test_a_server_with_a_live_transcriber_sends_words_over_the_websocket_before_the_commit(live_server: Any) -> None:
    import urllib.request

    from websockets.sync.client import connect

    from benchmarks.eval.quality import word_errors
    from benchmarks.eval.samples import sample_question, sample_text

    listening = live_server
    samples, rate = sample_question("largest_planet")
    pcm = float_to_pcm16_bytes(resample(samples, rate, RATE))
    chunk = RATE // 10 * 2
    events: list[dict[str, Any]] = []
    with connect(listening.url.replace("http", "ws") + "/v1/realtime?model=slow") as ws:
        ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        for offset in range(0, len(pcm), chunk):
            audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            while True:  # what came meanwhile, without waiting
                try:
                    events.append(json.loads(ws.recv(timeout=0)))
                except TimeoutError:
                    break
            time.sleep(0.1)
        during = sum(e["type"] == "conversation.item.input_audio_transcription.delta" for e in events)
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while not events or events[-1]["type"] != "conversation.item.done":
            events.append(json.loads(ws.recv(timeout=60)))
    deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    [completed] = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert during >= 1, events
    assert "".join(deltas) == completed["transcript"]
    assert word_errors(sample_text("largest_planet"), completed["transcript"])[0] == 0, completed["transcript"]
    with urllib.request.urlopen(listening.url + "/health") as answer:  # no key: the server has none
        health = json.loads(answer.read())
    assert health["in_flight"] == 0, health
    assert listening.loop is not None and listening.state.live_transcriber is not None
    nothing_held(listening.state.live_transcriber, listening.loop)  # the live pipeline holds nothing of the turn


def test_server_vad_opens_the_live_request_at_speech_start_and_it_gets_exactly_the_committed_audio() -> None:
    from benchmarks.eval.samples import sample_question
    from omnictl.serving.realtime.vad import SileroModel

    samples, rate = sample_question("spider_legs")
    pad = np.zeros(RATE // 2, np.float32)
    spoken = float_to_pcm16_bytes(np.concatenate([pad, resample(samples, rate, RATE), pad, pad]))
    silero = SileroModel()

    async def scenario() -> None:
        client = Client()
        client.session._silero = lambda: silero
        client.session.settings.vad = ev.ServerVad(silence_duration_ms=400)
        client.session._reset_vad()
        committed_samples: list[int] = []
        user_audio = client.session.conversation.user_audio
        client.session.conversation.user_audio = lambda samples, item_id=None: (  # type: ignore[method-assign]
            committed_samples.append(samples.size), user_audio(samples, item_id))[1]
        for start in range(0, len(spoken), 4800):  # 100 ms pieces, as a microphone delivers them
            await client.append_raw(spoken[start : start + 4800])
        await client.settle()
        [started] = client.of("input_audio_buffer.speech_started")
        [committed] = client.of("input_audio_buffer.committed")
        deltas = client.of("conversation.item.input_audio_transcription.delta")
        types = client.types()
        # words came between speech start and the commit, for the item the turn became
        assert types.index("input_audio_buffer.speech_started") < types.index(
            "conversation.item.input_audio_transcription.delta") < types.index("input_audio_buffer.committed")
        assert {d["item_id"] for d in deltas} == {started["item_id"], committed["item_id"]}
        [live] = client.live.requests  # one request for the turn, none before speech started
        [(request, *_)] = client.pipeline.submitted  # the response, on the live transcript
        said = [p.text for m in request.messages for p in m.parts if hasattr(p, "text")]
        assert said[-1] == client.of("conversation.item.input_audio_transcription.completed")[0]["transcript"]
        # the live request got the turn's audio from its prefix padding on: what the commit holds
        turn = client.session.conversation.turns[0]
        assert turn.audio is None and live.received == committed_samples[0] * 2 > RATE * 2
        # answered early at the pause from the live transcript (issue 46): asked once for the
        # transcript so far, which became the turn's; then aborted, its input never ended
        assert live.tentatives == 1 and not live.ended and client.live.aborts == [live.id]

    asyncio.run(asyncio.wait_for(scenario(), 30))
