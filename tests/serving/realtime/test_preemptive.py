"""Preemptive answers (issue 39, Build 3), end to end: a real `omnictl serve` of the embedded
voice assistant (real models), the official `openai` client over `/v1/realtime`, server VAD
deciding the turns. At a pause in speech the server starts answering the audio so far; the
client sees nothing of it until the turn is confirmed. A pause mid-question (longer than
preempt_ms, shorter than the confirmation) drops it everywhere; a plain question is answered
by it.

What the client cannot see is read from the server: ``/metrics``
(``omnictl_realtime_preemptive_answers_total``), ``/health`` (requests in flight, each
stage's state) and the run's trace (the turn's milestones). The server is the run's one voice
assistant (``voice_server``), whose run folder /health names.

Below them, in the test process, the session object against the scripted pipeline: the
orderings a server cannot be made to hit on cue, and the fifty paused questions, whose turns
come from a scripted voice-activity source (``voice_activity.py``) rather than real speech."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from benchmarks.realtime_turn_detection import question, with_pause
from omnictl.inputs import PCM16_RATE
from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.store import TraceStore
from omnictl.serving.realtime.vad import PREEMPT_MS
from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.speech import chunks, collect_until_done, pcm16, silence
from tests.serving.realtime.voice_activity import ScriptedVoiceActivity, voice
from tests.support.wait import eventually, until

CONFIRM_MS = 800  # the session's silence_duration_ms: the turn is confirmed after this much silence
PAUSE_MS = 450  # a pause mid-question: past preempt_ms, short of the confirmation
assert PREEMPT_MS < PAUSE_MS < CONFIRM_MS - 200  # (the VAD's frames and hysteresis blur edges by ~100 ms)
ANSWER_EVENTS = ("response.", "conversation.item.input_audio_transcription.", "conversation.item.added",
                 "conversation.item.done", "output_audio_buffer.")
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(voice_server: ServerProcess) -> ServerProcess:
    """The run's one `omnictl serve` of the embedded voice assistant (tests/serving/conftest.py)."""
    return voice_server


@pytest.fixture(scope="module")
def run_dir(server: ServerProcess) -> Path:
    """Where that server records its run's traces: a server profiles, in a run folder of its
    own when none is given, and /health says which."""
    found = health(server)["run_dir"]
    assert found is not None, health(server)
    return Path(found)


@pytest.fixture()
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def health(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()  # type: ignore[no-any-return]


def idle(server: ServerProcess) -> bool:
    """No request left anywhere: server, coordinator, and every stage's buffers and slots."""
    body = health(server)
    return (body["in_flight"] == 0 and body["pipeline_in_flight"] == 0
            and all(s.get("requests", 0) == 0 and s.get("slots_in_use", 0) == 0 for s in body["stages"].values()))


def preemptive(server: ServerProcess) -> dict[str, float]:
    """outcome -> omnictl_realtime_preemptive_answers_total."""
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=10).text
    found = re.findall(r'^omnictl_realtime_preemptive_answers_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {outcome: float(value) for outcome, value in found}


def open_session(connection: Any) -> None:
    assert connection.recv().type == "session.created"
    connection.session.update(session={
        "type": "realtime", "output_modalities": ["text", "audio"], "max_output_tokens": 12,
        "instructions": "Answer in a few words.",
        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": CONFIRM_MS}}}})
    assert connection.recv().type == "session.updated"


@functools.cache
def paused_question(name: str) -> tuple[bytes, bytes]:
    """The question spoken with a pause before its last word, as (up to the end of the pause,
    the rest and a silence past the confirmation)."""
    audio = with_pause(question(name), PAUSE_MS)
    silent = np.concatenate([[1], (audio != 0).astype(np.int8), [1]])
    edges = np.diff(silent)
    starts, ends = np.nonzero(edges == -1)[0], np.nonzero(edges == 1)[0]  # runs of exact zeros: the inserted pause
    longest = int(np.argmax(ends - starts))
    assert ends[longest] - starts[longest] >= PAUSE_MS * PCM16_RATE // 1000
    pcm = pcm16(audio, PCM16_RATE)
    cut = int(ends[longest]) * 2
    return silence(300) + pcm[:cut], pcm[cut:] + silence(CONFIRM_MS + 700)


ANSWER_STAGES = ("thinker", "decode", "tts")  # the voice assistant's stages a transcription does not use


def answering(server: ServerProcess) -> bool:
    """The preemptive answer's response request is in the pipeline (past its transcription)."""
    stages = health(server)["stages"]
    return any(stages[name].get("requests", 0) >= 1 for name in ANSWER_STAGES)


def ask_with_a_pause(connection: Any, server: ServerProcess, name: str) -> list[Any]:
    """Speak ``name`` with its pause; once the server is answering the words before the pause
    (which the client cannot see: read from /health), the rest. Every event to the answer's end."""
    before, after = paused_question(name)
    for audio in chunks(before):
        connection.input_audio_buffer.append(audio=audio)
    # The preemptive answer is at work: wait for its response's request in the stages, so the
    # drop is of work in flight.
    until(lambda: answering(server), "the preemptive answer's response in the stages", timeout=60, interval=0.02)
    for audio in chunks(after):
        connection.input_audio_buffer.append(audio=audio)
    return collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))


def check_one_answer_to_the_whole_turn(events: list[Any]) -> None:
    """Nothing of an answer before the turn was committed; then one user item, one response.
    ``events``: the client's (the `openai` client's typed events, or the JSON of each as dicts)."""
    events = [e if isinstance(e, dict) else e.model_dump() for e in events]
    types = [e["type"] for e in events]
    committed = types.index("input_audio_buffer.committed")
    # The turn's own words stream while it is spoken (issue 46: transcription deltas by default,
    # for the item the turn becomes); nothing else of a transcript or an answer comes before.
    spoken = [e for e in events[:committed] if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert {e["item_id"] for e in spoken} <= {events[committed]["item_id"]}, types
    early = [t for t in types[:committed] if t.startswith(ANSWER_EVENTS)
             and t != "conversation.item.input_audio_transcription.delta"]
    assert early == [], types  # the dropped answer: not a response, transcript, item or audio
    assert types.count("input_audio_buffer.committed") == 1 and types.count("response.created") == 1, types
    assert types.count("input_audio_buffer.speech_stopped") == 1, types  # one turn: the pause did not end it
    user_items = [e for e in events if e["type"] == "conversation.item.added" and e["item"]["role"] == "user"]
    assert len(user_items) == 1 and user_items[0]["item"]["id"] == events[committed]["item_id"]
    response = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    audio = {e["response_id"] for e in events if e["type"] == "response.output_audio.delta"}
    assert audio == {response}, types  # spoken, and only by the answer the client was told of


def test_a_pause_mid_question_drops_the_preemptive_answer_and_the_answer_hears_it_all(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    before = preemptive(server)
    with client.realtime.connect(model="voice-assistant") as connection:
        open_session(connection)
        events = ask_with_a_pause(connection, server, "capital_of_france")  # "What is the capital of | France?"
    check_one_answer_to_the_whole_turn(events)
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "france" in heard.transcript.lower(), heard.transcript  # the turn is the whole question
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "completed" and "Paris" in done.output[0].content[0].transcript, done.output
    until(lambda: preemptive(server)["used"] == before["used"] + 1, "the preemptive answer counted as used", timeout=10)
    after = preemptive(server)
    assert after["dropped"] >= before["dropped"] + 1, (before, after)  # the one started at the pause
    until(lambda: idle(server), "no request state left anywhere", timeout=30)


def milestones(run_dir: Path, turn_id: str, wanted: str, timeout: float = 20.0) -> list[Event]:
    """The turn's milestone events once ``wanted`` is among them (the recorder ships in batches)."""
    deadline = time.monotonic() + timeout
    while True:
        events = [e for e in TraceStore(run_dir).events(turn_id) if e.kind is EventKind.TURN_MILESTONE]
        if any(e.meta["milestone"] == wanted for e in events) or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def test_a_plain_question_is_answered_by_the_answer_started_at_its_end(
    client: openai.OpenAI, server: ServerProcess, run_dir: Path
) -> None:
    before = preemptive(server)
    with client.realtime.connect(model="voice-assistant") as connection:
        open_session(connection)
        for audio in chunks(silence(300) + pcm16(question("capital_of_france"), PCM16_RATE) + silence(CONFIRM_MS + 700)):
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
    types = [e.type for e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "conversation.item.added", "response.created", "response.output_item.added",
             "response.content_part.added", "response.output_audio.delta", "response.output_audio.done",
             "response.output_item.done", "response.done"]
    firsts = [types.index(t) for t in order]
    assert firsts == sorted(firsts), types  # the usual order
    check_one_answer_to_the_whole_turn(events)
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "completed" and "Paris" in done.output[0].content[0].transcript, done.output
    until(lambda: preemptive(server)["used"] == before["used"] + 1, "the preemptive answer counted as used", timeout=10)
    after = preemptive(server)
    assert after["dropped"] == before["dropped"], (before, after)  # it was the one started at the pause
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    recorded = milestones(run_dir, stopped.item_id, "first_audio_sent")
    order = [str(e.meta["milestone"]) for e in recorded]  # in time order
    assert "preemptive_dropped" not in order, order
    # answered from the pause: started before the stop (its request submitted before or after the
    # stop, as fast as the transcription was), its audio sent after the turn was confirmed
    for chain in (["preempted", "speech_stopped", "turn_confirmed", "first_audio_sent"],
                  ["preempted", "response_started", "first_audio_sent"]):
        assert [m for m in order if m in chain] == chain, order
    until(lambda: idle(server), "no request state left anywhere", timeout=30)


def test_semantic_vad_answers_a_plain_question_with_the_answer_started_at_its_pause(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    """The turn model confirms the turn (after 300 ms of silence at eagerness auto); the answer
    started at 200 ms is the one the client gets."""
    before = preemptive(server)
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={
            "type": "realtime", "output_modalities": ["text", "audio"], "max_output_tokens": 12,
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}}}})
        assert connection.recv().type == "session.updated"
        for audio in chunks(silence(300) + pcm16(question("capital_of_france"), PCM16_RATE) + silence(4500)):
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
    check_one_answer_to_the_whole_turn(events)
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "completed" and "Paris" in done.output[0].content[0].transcript, done.output
    until(lambda: preemptive(server)["used"] == before["used"] + 1, "the preemptive answer counted as used", timeout=10)
    assert preemptive(server)["dropped"] == before["dropped"]
    until(lambda: idle(server), "no request state left anywhere", timeout=30)


# --- in the test process: the session object, real Silero VAD, the scripted pipeline ---------
# (as tests/serving/realtime/test_session_events.py; the pipeline is the one test double, so
# every request the session submits and aborts is known)


@functools.cache
def silero() -> Any:
    """The Silero VAD model, loaded once for the module: an ONNX session each session's
    detector only reads (every detector keeps its own state, as on a server)."""
    from omnictl.serving.realtime.vad import SileroModel

    return SileroModel()


class Session:
    """A realtime session answering its turns by server VAD, and what it sent."""

    def __init__(self, server: Session | None = None, vad: Any = None) -> None:
        """``server``: another session whose pipeline and server state this one shares (as the
        sessions of one server do); ``vad``: the voice-activity model (real Silero by default)."""
        from omnictl.coordinator.request import RequestEvent, RequestEventKind
        from omnictl.outputs import Transcript
        from omnictl.serving.realtime import events as ev
        from omnictl.serving.realtime.session import RealtimeSession
        from omnictl.serving.state import ServingState
        from tests.serving.scripted import ScriptedPipeline, text_events

        if server is not None:
            self.pipeline, self.state = server.pipeline, server.state
        else:
            self.pipeline = ScriptedPipeline(script=lambda inputs, modalities: (
                [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="what is the capital of"))]
                if modalities == ["transcript"] else text_events(["an", "answer"])))
            self.state = ServingState(model_name="m", pipeline=self.pipeline)  # type: ignore[arg-type]
        self.sent: list[dict[str, Any]] = []
        self.ev = ev
        model = vad if vad is not None else silero()
        self.session = RealtimeSession(self.state, self.pipeline, lambda e: self.sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                                       "m", silero=lambda: model)
        self.session.settings.output_modalities = ["text"]

    async def send(self, event: dict[str, Any]) -> None:
        await self.session.handle(self.ev.decode_client_event(json.dumps(event)))

    async def speak(self, pcm: bytes) -> None:
        for start in range(0, len(pcm), 4800):
            await self.session.feed(pcm[start : start + 4800])

    def submitted(self, prefix: str) -> list[str]:
        return [rid for _, _, rid, _, _ in self.pipeline.submitted if rid and rid.startswith(prefix)]

    async def paused(self) -> None:
        """The question up to its pause: the preemptive answer's response submitted, nothing sent."""
        from tests.support.wait import eventually

        before, _ = paused_question("capital_of_france")
        await self.speak(before)
        await eventually(lambda: self.submitted("resp_req"), "the preemptive answer submitted")
        assert [e["type"] for e in self.sent] == ["input_audio_buffer.speech_started"]  # nothing of it

    async def transcribing(self) -> None:
        """The question up to its pause: the pause's transcription submitted (it may still be at work)."""
        from tests.support.wait import eventually

        before, _ = paused_question("capital_of_france")
        await self.speak(before)
        await eventually(lambda: self.submitted("transcribe"), "the pause's transcription submitted")

    def dropped_everywhere(self) -> None:
        """Every request the preemptive answer made was aborted; nothing of it sent or kept."""
        assert set(self.submitted("resp_req")) <= set(self.pipeline.aborts), self.pipeline.aborts
        assert not self.state.active and not self.session.conversation.turns
        assert not any(e["type"].startswith(ANSWER_EVENTS) for e in self.sent), self.sent


def run_session(scenario: Any) -> None:
    from tests.support.wait import run

    run(scenario, timeout=60)


def test_a_clear_drops_the_preemptive_answer_everywhere() -> None:
    async def scenario() -> None:
        s = Session()
        await s.paused()
        await s.send({"type": "input_audio_buffer.clear"})
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
        s.dropped_everywhere()
        assert [e["type"] for e in s.sent] == ["input_audio_buffer.speech_started", "input_audio_buffer.cleared"]
        assert s.state.metrics.preemptive.labels("dropped")._value.get() == 1  # type: ignore[attr-defined]

    run_session(scenario)


def test_a_closed_session_drops_the_preemptive_answer_everywhere() -> None:
    async def scenario() -> None:
        s = Session()
        await s.paused()
        await s.session.close()
        s.dropped_everywhere()

    run_session(scenario)


def test_response_create_during_the_pause_drops_it_and_answers_once() -> None:
    async def scenario() -> None:
        s = Session()
        await s.send({"type": "conversation.item.create", "item": {
            "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}})  # what response.create answers
        s.sent.clear()
        await s.paused()
        [held] = s.submitted("resp_req")
        await s.send({"type": "response.create"})
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
        assert held in s.pipeline.aborts
        types = [e["type"] for e in s.sent]
        assert types.count("response.created") == 1 and types[-1] == "response.done", types
        [done] = [e for e in s.sent if e["type"] == "response.done"]
        assert done["response"]["status"] == "completed"
        assert s.submitted("resp_req")[-1] != held and s.submitted("resp_req")[-1] not in s.pipeline.aborts

    run_session(scenario)


def test_the_turn_confirmed_at_the_pause_is_answered_by_the_held_response() -> None:
    async def scenario() -> None:
        s = Session()
        await s.paused()
        [held] = s.submitted("resp_req")
        await s.speak(silence(800))  # the silence goes on: server VAD's 700 ms confirm the turn
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
        types = [e["type"] for e in s.sent]
        assert types == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.added",
                         "conversation.item.input_audio_transcription.delta",
                         "conversation.item.input_audio_transcription.completed", "conversation.item.done",
                         "response.created", "conversation.item.added", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                         "response.output_text.done", "response.content_part.done", "response.output_item.done",
                         "conversation.item.done", "response.done"], types
        assert s.submitted("resp_req") == [held] and len(s.submitted("transcribe")) == 1 and not s.pipeline.aborts
        [heard] = [e for e in s.sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
        assert heard["transcript"] == "what is the capital of"  # the transcript the answer heard
        assert [t.role for t in s.session.conversation.turns] == ["user", "assistant"]
        assert s.state.metrics.preemptive.labels("used")._value.get() == 1  # type: ignore[attr-defined]

    run_session(scenario)


def test_a_held_answers_milestones_are_when_they_happened_and_its_first_text_counts_from_its_release() -> None:
    # The held answer is read at its release, but its transcript and first token came at the
    # pause: the turn's clock says so, and the time to first text does not count the hold.
    async def scenario() -> None:
        s = Session()
        await s.paused()
        await asyncio.sleep(0.3)  # held: the transcript and the answer's text wait, unread
        await s.speak(silence(800))  # confirmed
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
        clock = s.session.turn_clock
        assert clock is not None
        at = clock.stamps
        # (the scripted pipeline has its events ready at the submission, before response_started)
        assert at["preempted"] <= at["transcript_final"] <= at["first_token"] <= at["response_started"] + 0.01e9, at
        assert at["turn_confirmed"] - at["first_token"] >= 0.25e9, at  # before the release, by the hold
        assert at["turn_confirmed"] - at["transcript_final"] >= 0.25e9, at
        first_text = s.state.metrics.first_text
        assert first_text._sum.get() < 0.25  # type: ignore[attr-defined]  # from the release, not the submission

    run_session(scenario)


def test_speech_resuming_drops_the_held_answer_and_the_turn_gets_the_next_one() -> None:
    from tests.support.wait import eventually

    async def scenario() -> None:
        s = Session()
        await s.paused()
        [held] = s.submitted("resp_req")
        _, after = paused_question("capital_of_france")
        spoken = len(after) - len(silence(CONFIRM_MS + 700))
        await s.speak(after[:spoken])  # "France?"
        await eventually(lambda: held in s.pipeline.aborts, "the held answer aborted as the speech came back")
        assert "input_audio_buffer.speech_stopped" not in [e["type"] for e in s.sent]
        await s.speak(after[spoken:])  # silence to the confirmation
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
        answered = s.submitted("resp_req")[-1]
        assert answered != held and answered not in s.pipeline.aborts  # the answer started at the real end
        types = [e["type"] for e in s.sent]
        assert types.count("response.created") == 1 and types.count("input_audio_buffer.committed") == 1, types
        assert types.index("input_audio_buffer.committed") < types.index("response.created")
        assert [t.role for t in s.session.conversation.turns] == ["user", "assistant"]
        assert not s.state.active
        metrics = s.state.metrics.preemptive
        assert metrics.labels("dropped")._value.get() == 1 and metrics.labels("used")._value.get() == 1  # type: ignore[attr-defined]

    run_session(scenario)


# --- adversarial orderings: every path leaves nothing running, and tells the client the truth ---


class Gated:
    """A scripted request whose events wait for ``gate`` (or its abort): a slow transcription."""

    def __init__(self, inner: Any, gate: asyncio.Event) -> None:
        self.inner, self.gate, self.id = inner, gate, inner.id

    async def events(self) -> Any:
        waiting = [asyncio.ensure_future(self.gate.wait()), asyncio.ensure_future(self.inner.aborted.wait())]
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiting:
                task.cancel()
        async for event in self.inner.events():
            yield event


def gate_next_transcription(s: Session) -> asyncio.Event:
    """The session's next transcription gives its transcript only once the gate opens."""
    gate = asyncio.Event()
    submit = s.pipeline.submit

    async def gated(inputs: Any, modalities: list[str] | None = None, **kw: Any) -> Any:
        request = await submit(inputs, modalities, **kw)
        if modalities != ["transcript"]:
            return request
        s.pipeline.submit = submit  # type: ignore[method-assign]  # only this one
        return Gated(request, gate)

    s.pipeline.submit = gated  # type: ignore[method-assign]
    return gate


async def settle(s: Session) -> None:
    while s.session._tasks:
        await asyncio.gather(*list(s.session._tasks), return_exceptions=True)
    await asyncio.sleep(0)  # tasks' done callbacks


def nothing_left(s: Session, before: set[asyncio.Task[Any]]) -> None:
    """No pipeline request tracked, none in flight, no task of the session's or any other left
    (but those of ``before``: the test's own)."""
    assert not s.state.active, s.state.active
    assert s.state.metrics.in_flight._value.get() == 0  # type: ignore[attr-defined]
    assert not s.session._tasks, s.session._tasks
    others = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert not others, others


def answered_after_the_commit(s: Session) -> list[str]:
    """The events sent: exactly one response.done per response.created, none before the commit."""
    types = [e["type"] for e in s.sent]
    assert types.count("response.created") == types.count("response.done"), types
    if "response.created" in types:
        assert types.index("input_audio_buffer.committed") < types.index("response.created"), types
    return types


def test_the_session_closing_as_the_held_answer_is_released_leaves_nothing_running() -> None:
    # The turn is confirmed and the session closes before the release's task has run a step:
    # the held request is aborted and untracked all the same.
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        await s.paused()
        [held] = s.submitted("resp_req")
        await eventually(lambda: held in s.state.active, "the held answer tracked")
        pcm = silence(800)
        for start in range(0, len(pcm), 960):
            await s.session.feed(pcm[start : start + 960])
            if s.session.response is not None:  # released: its task not started yet
                await s.session.close()
                break
        else:
            raise AssertionError("the turn was not confirmed")
        await settle(s)
        assert held in s.pipeline.aborts
        answered_after_the_commit(s)
        nothing_left(s, tests)

    run_session(scenario)


def test_response_cancel_while_the_released_answer_waits_for_its_transcript() -> None:
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        gate = gate_next_transcription(s)
        await s.transcribing()
        await s.speak(silence(800))  # confirmed while the transcription is still at work
        assert s.session.response is not None and "response.created" not in [e["type"] for e in s.sent]
        await s.send({"type": "response.cancel"})
        gate.set()
        await settle(s)
        types = answered_after_the_commit(s)
        assert types.count("response.created") == 1, types
        [done] = [e for e in s.sent if e["type"] == "response.done"]
        assert done["response"]["status"] == "cancelled"
        assert all(r in s.pipeline.aborts for r in s.submitted("resp_req")), (s.pipeline.submitted, s.pipeline.aborts)
        nothing_left(s, tests)

    run_session(scenario)


def test_the_held_request_failing_before_the_release_fails_the_response_once() -> None:
    from omnictl.coordinator.request import RequestEvent, RequestEventKind
    from omnictl.outputs import Transcript
    from tests.serving.scripted import error_event

    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        s.pipeline.script = lambda inputs, modalities: (
            [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="what is the capital of"))]
            if modalities == ["transcript"] else [error_event("the thinker fell over")])
        await s.paused()
        await s.speak(silence(800))
        await settle(s)
        answered_after_the_commit(s)
        [done] = [e for e in s.sent if e["type"] == "response.done"]
        assert done["response"]["status"] == "failed", done
        nothing_left(s, tests)

    run_session(scenario)


def test_the_pauses_transcription_failing_is_answered_at_the_turn() -> None:
    from omnictl.coordinator.request import RequestEvent, RequestEventKind
    from omnictl.outputs import Transcript
    from tests.serving.scripted import error_event, text_events

    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        failed: list[int] = []

        def script(inputs: Any, modalities: list[str]) -> list[Any]:
            if modalities != ["transcript"]:
                return text_events(["an", "answer"])
            if not failed:
                failed.append(1)
                return [error_event("the recogniser fell over")]
            return [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="what is the capital of France"))]

        s.pipeline.script = script
        await s.transcribing()
        await s.speak(silence(800))
        await settle(s)
        types = answered_after_the_commit(s)
        assert types.count("response.created") == 1 and types[-1] == "response.done", types
        [heard] = [e for e in s.sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
        assert heard["transcript"] == "what is the capital of France"
        assert len(s.submitted("transcribe")) == 2 and len(s.submitted("resp_req")) == 1
        nothing_left(s, tests)

    run_session(scenario)


def test_deleting_the_turn_while_its_released_answer_waits_for_the_transcript() -> None:
    # The client deleted the item: nothing more is said of it, and the answer does not hear it.
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        gate = gate_next_transcription(s)
        await s.transcribing()
        await s.speak(silence(800))
        [committed] = [e for e in s.sent if e["type"] == "input_audio_buffer.committed"]
        await s.send({"type": "conversation.item.delete", "item_id": committed["item_id"]})
        gate.set()
        await settle(s)
        answered_after_the_commit(s)
        deleted = [i for i, e in enumerate(s.sent) if e["type"] == "conversation.item.deleted"]
        later = [e for e in s.sent[deleted[0] + 1 :] if e.get("item_id") == committed["item_id"]
                 or e.get("item", {}).get("id") == committed["item_id"]]
        assert later == [], later
        nothing_left(s, tests)

    run_session(scenario)


@pytest.mark.parametrize("words", [True, False])
def test_an_item_deleted_while_it_is_transcribed_is_not_told_of_again(words: bool) -> None:
    from tests.serving.scripted import text_events

    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        if not words:  # the recogniser heard none
            s.pipeline.script = lambda inputs, modalities: [] if modalities == ["transcript"] else text_events(["a"])
        gate = gate_next_transcription(s)
        await s.send({"type": "conversation.item.create", "item": {"id": "said", "role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(silence(300)).decode()}]}})
        await s.send({"type": "conversation.item.delete", "item_id": "said"})
        gate.set()
        await settle(s)
        assert [e["type"] for e in s.sent] == ["conversation.item.added", "conversation.item.deleted"], s.sent
        nothing_left(s, tests)

    run_session(scenario)


def test_a_drop_while_the_held_answer_waits_for_an_earlier_transcription_leaves_no_task() -> None:
    # The answer at the pause waits for the transcripts of the items before it; dropped then,
    # what it waited with must go too (else a task waits forever for a cancel that never comes).
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        gate = gate_next_transcription(s)
        await s.send({"type": "conversation.item.create", "item": {"role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(silence(300)).decode()}]}})  # transcribing, gated
        before, _ = paused_question("capital_of_france")
        await s.speak(before)
        await eventually(lambda: len(s.submitted("transcribe")) == 2, "the pause's transcription submitted")
        await eventually(lambda: s.session._preempt is not None and s.session._preempt.transcript is not None,
                         "the pause heard")
        assert not s.submitted("resp_req")  # waiting for the item before it
        await s.send({"type": "input_audio_buffer.clear"})  # dropped
        gate.set()
        await settle(s)
        nothing_left(s, tests)

    run_session(scenario)


def test_the_answers_item_follows_the_turn_it_answers() -> None:
    async def scenario() -> None:
        s = Session()
        await s.paused()
        await s.speak(silence(800))  # confirmed: the held answer goes out
        await settle(s)
        added = [e for e in s.sent if e["type"] == "conversation.item.added"]
        assert [(e["item"]["role"], e["previous_item_id"]) for e in added] == [
            ("user", None), ("assistant", added[0]["item"]["id"])]

    run_session(scenario)


def test_the_session_closing_while_the_released_answer_waits_for_its_transcript_leaves_nothing_running() -> None:
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        gate_next_transcription(s)  # never opens: only the close ends it
        await s.transcribing()
        await s.speak(silence(800))  # confirmed, released: waiting for the transcript
        assert s.session.response is not None
        await s.session.close()
        await settle(s)
        assert s.submitted("transcribe")[0] in s.pipeline.aborts and not s.submitted("resp_req")
        answered_after_the_commit(s)
        nothing_left(s, tests)

    run_session(scenario)


def test_a_session_update_between_the_pause_and_the_turn_is_answered_with_the_new_settings() -> None:
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        await s.paused()
        [held] = s.submitted("resp_req")
        await s.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be terse."}})
        await s.speak(silence(800))
        await settle(s)
        assert held in s.pipeline.aborts
        [answer] = [inputs for inputs, _, rid, _, _ in s.pipeline.submitted if rid and rid != held
                    and rid.startswith("resp_req")]
        assert answer.messages[0].parts[0].text == "Be terse."  # not the settings at the pause
        types = answered_after_the_commit(s)
        assert types.count("response.created") == 1, types
        nothing_left(s, tests)

    run_session(scenario)


def test_a_preemptive_start_that_failed_and_was_dropped_is_logged_once_with_its_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        s.pipeline.refuse = RuntimeError("a bug in the pipeline client")  # not a refusal it knows
        await s.transcribing()
        [transcribe] = s.submitted("transcribe")
        s.pipeline.refuse = None
        await s.send({"type": "input_audio_buffer.clear"})
        await settle(s)
        failed = [r for r in caplog.records if "RuntimeError" in r.getMessage() + (r.exc_text or "")
                  or (r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError))]
        assert len(failed) == 1 and transcribe in failed[0].getMessage(), [r.getMessage() for r in caplog.records]
        nothing_left(s, tests)

    with caplog.at_level(logging.INFO, logger="omnictl"):
        run_session(scenario)


def test_a_commit_at_the_pause_ends_the_turn_the_speech_started() -> None:
    # The client commits the turn itself (server VAD on): the held answer is dropped, the turn is
    # the item speech_started named, and the silence after it is no second turn of its own.
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        await s.paused()
        [held] = s.submitted("resp_req")
        await s.send({"type": "input_audio_buffer.commit"})
        await s.speak(silence(800))  # past where server VAD would have ended the turn
        await settle(s)
        assert held in s.pipeline.aborts
        types = [e["type"] for e in s.sent]
        assert types == ["input_audio_buffer.speech_started", "input_audio_buffer.committed",
                         "conversation.item.added", "conversation.item.input_audio_transcription.delta",
                         "conversation.item.input_audio_transcription.completed", "conversation.item.done"], types
        started, committed = s.sent[0], s.sent[1]
        assert committed["item_id"] == started["item_id"]
        assert [t.id for t in s.session.conversation.turns] == [started["item_id"]]
        nothing_left(s, tests)

    run_session(scenario)


def test_with_a_live_transcriber_a_commit_mid_turn_leaves_one_item_of_that_id() -> None:
    from omnictl.serving.realtime.events import ServerVad
    from omnictl.serving.realtime.vad import SileroModel
    from tests.serving.realtime.test_live_transcription import Client

    async def scenario() -> None:
        # The live request is the turn's from speech start: the commit was already under its id.
        client, silero = Client(), SileroModel()
        client.session._silero = lambda: silero
        client.session.settings.vad = ServerVad()  # (its Client turns detection off)
        client.session._reset_vad()
        before, _ = paused_question("capital_of_france")
        for start in range(0, len(before), 4800):
            await client.append_raw(before[start : start + 4800])
        await client.send({"type": "input_audio_buffer.commit"})
        for start in range(0, len(silence(800)), 4800):
            await client.append_raw(silence(800)[start : start + 4800])
        await client.settle()
        ids = [t.id for t in client.session.conversation.turns if t.role == "user"]
        [started] = client.of("input_audio_buffer.speech_started")
        assert ids == [started["item_id"]], (ids, client.types())

    run_session(scenario)


def test_a_held_answer_submitted_just_after_its_drop_leaves_the_turns_clock_to_the_real_answer() -> None:
    # Its submission was already under way when the user went on speaking: it must not stamp
    # response_started on the turn (the drop started the turn's clock again), or the turn's
    # answer is timed from the dropped one's submission (or, answered without a preemptive
    # start, is no turn's at all: no milestones).
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        gate, submit = asyncio.Event(), s.pipeline.submit

        async def gated(inputs: Any, modalities: list[str] | None = None, **kw: Any) -> Any:
            if modalities != ["transcript"] and not gate.is_set():
                await gate.wait()  # the held answer's submission, in flight
            return await submit(inputs, modalities, **kw)

        s.pipeline.submit = gated  # type: ignore[method-assign]
        before, after = paused_question("capital_of_france")
        await s.speak(before)
        await eventually(lambda: s.submitted("resp_req") == [] and s.session._preempt is not None
                         and s.session._preempt.run.request_id is not None, "the held answer submitting")
        gate.set()  # its submission returns...
        s.session._preempt_drop("the user went on speaking")  # ...as the speech comes back (feed's SpeechResumed)
        await s.speak(after)  # "France?", then the turn ends
        await settle(s)
        clock = s.session.turn_clock
        assert clock is not None and "first_token" in clock.stamps, clock.stamps  # the answer is the turn's
        at = clock.stamps  # its request submitted after the pause it answered, not the dropped one's
        assert at["preempted"] <= at["response_started"], at
        answered_after_the_commit(s)
        nothing_left(s, tests)

    run_session(scenario)


def test_the_session_closing_right_after_a_drop_still_aborts_the_dropped_answer() -> None:
    # A clear, then the socket closes at once: the drop's own task had not run yet when close
    # cancelled the session's tasks.
    async def scenario() -> None:
        s, tests = Session(), asyncio.all_tasks()
        await s.paused()
        [held] = s.submitted("resp_req")
        await eventually(lambda: held in s.state.active, "the held answer tracked")
        await s.send({"type": "input_audio_buffer.clear"})
        await s.session.close()
        await settle(s)
        assert held in s.pipeline.aborts
        nothing_left(s, tests)

    run_session(scenario)


# --- fifty paused questions: the turns from a scripted voice-activity source --------------------


@functools.cache
def scripted_paused_question() -> tuple[bytes, bytes]:
    """A question with a pause before its last word, for the scripted voice-activity source:
    (up to the end of the pause, the last word and a silence past the confirmation)."""
    return silence(300) + voice(1200) + silence(PAUSE_MS), voice(400) + silence(CONFIRM_MS + 700)


def heard(inputs: Any, modalities: list[str]) -> list[Any]:
    """The scripted pipeline: a transcription hears the words up to the pause, or the whole
    question once it is longer than the audio up to the pause; an answer speaks two words."""
    from omnictl.coordinator.request import RequestEvent, RequestEventKind
    from omnictl.outputs import AudioChunk, TextDelta, TextResult, Transcript
    from tests.serving.scripted import RATE, tone

    if modalities == ["transcript"]:
        part = inputs.messages[0].parts[0]
        whole = part.samples.size / part.sample_rate > len(scripted_paused_question()[0]) / 2 / PCM16_RATE
        text = "what is the capital of France" if whole else "what is the capital of"
        return [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text=text))]
    return [RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("Paris ")),
            RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(tone(0.05), RATE, transcript="Paris ")),
            RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("indeed.")),
            RequestEvent(RequestEventKind.STREAM, "speak", AudioChunk(tone(0.05), RATE, transcript="indeed.")),
            RequestEvent(RequestEventKind.RESULT, "answer", TextResult("Paris indeed."))]


async def ask_with_a_scripted_pause(s: Session, wait_for_the_answer: bool) -> tuple[list[dict[str, Any]], str]:
    """Speak a question with its pause; once the early answer is at work (``wait_for_the_answer``:
    its response request submitted and tracked; else its transcription, held at work), the rest.
    (The events of the question, to its answer's end; the dropped request.)"""
    start = len(s.sent)
    before, after = scripted_paused_question()
    if not wait_for_the_answer:
        gate_next_transcription(s)  # never opened: only the drop's abort ends it
    kind = "resp_req" if wait_for_the_answer else "transcribe"
    known = set(s.submitted(kind))
    await s.speak(before)
    await eventually(lambda: set(s.submitted(kind)) - known, f"the early answer's {kind} request submitted")
    [early] = set(s.submitted(kind)) - known
    await eventually(lambda: early in s.state.active, "the early answer's request at work")
    await s.speak(after)
    await settle(s)
    return s.sent[start:], early


def test_fifty_paused_questions_leave_nothing_of_their_dropped_answers() -> None:
    """The issue's test: 50 questions, each with a pause mid-sentence (10 sessions of 5, on one
    server's state): every dropped preemptive answer (30 dropped with their response at work,
    20 while their transcription was) leaves no conversation item, no audio or other event,
    no request, task or playback, and the metrics count 50 dropped and 50 used. The turns come
    from the scripted voice-activity source (the session's front end and turn detection are the
    real ones), the answers from the scripted pipeline; the same pause with real models, end to
    end, is this module's first test."""
    from omnictl.serving.realtime.turn_taking import Listening, Reply

    async def scenario() -> None:
        tests = asyncio.all_tasks()
        vad = ScriptedVoiceActivity()
        server = Session(vad=vad)  # only its pipeline and server state, which the ten sessions share
        server.pipeline.script = heard
        for _ in range(10):
            s = Session(server, vad)
            await s.send({"type": "session.update", "session": {
                "type": "realtime", "output_modalities": ["text", "audio"], "max_output_tokens": 12,
                "instructions": "Answer in a few words.",
                "audio": {"input": {"echo_guard": False,  # the scripted voice is not judged against the answer's
                                    "turn_detection": {"type": "server_vad", "silence_duration_ms": CONFIRM_MS}}}}})
            last_item = None  # the conversation's last item, as the client knows it
            for i in range(5):
                events, early = await ask_with_a_scripted_pause(s, wait_for_the_answer=i % 2 == 0)
                check_one_answer_to_the_whole_turn(events)
                assert early in s.pipeline.aborts and early not in s.state.active  # dropped everywhere
                # each item follows the one before it: no item of a dropped answer between them
                committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
                assert committed["previous_item_id"] == last_item, (committed, last_item)
                transcript = next(e for e in events
                                  if e["type"] == "conversation.item.input_audio_transcription.completed")
                assert transcript["transcript"] == "what is the capital of France"  # the whole turn
                answer = [r for r in s.submitted("resp_req") if r not in s.pipeline.aborts][-1]
                asked = next(inputs for inputs, _, rid, _, _ in s.pipeline.submitted if rid == answer)
                assert "France" in asked.messages[-1].parts[0].text  # the answer heard it all
                done = next(e for e in events if e["type"] == "response.done")["response"]
                assert done["status"] == "completed", done
                last_item = done["output"][0]["id"]
                core = s.session.core
                assert (core.listening, core.reply, core.early, core.playing) == (Listening.IDLE, Reply.NONE, None, [])
                assert s.session._preempt is None and not s.session.replies.discarding
                assert not s.session._playing_out and not s.state.active and not s.session._tasks
            start = len(s.sent)
            await s.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]}})
            added = s.sent[start]
            assert added["type"] == "conversation.item.added" and added["previous_item_id"] == last_item, added
            await s.session.close()
            await settle(s)
            assert [t.role for t in s.session.conversation.turns] == ["user", "assistant"] * 5 + ["user"]
        metrics = server.state.metrics.preemptive
        assert metrics.labels("used")._value.get() == 50  # type: ignore[attr-defined]
        assert metrics.labels("dropped")._value.get() == 50  # type: ignore[attr-defined]  # the one at each pause
        answers = server.submitted("resp_req")  # every one submitted, by all ten sessions
        assert len([r for r in answers if r not in server.pipeline.aborts]) == 50  # the rest were dropped
        # each question's early answer dropped (3 of 5 with their response submitted) and its last
        assert len(answers) == 10 * 3 + 50 and len(server.submitted("transcribe")) == 50 + 50
        assert vad.speech > 0 and vad.frames > vad.speech  # the scripted source heard the turns
        nothing_left(s, tests)

    run_session(scenario)
