"""The session as the shell of the turn-taking core (``omnictl/serving/realtime/session/shell.py``):
what the core decides reaches the client and the pipeline, over each transport.

- A reply lives until it has been heard (B1): over WebRTC, speech over an answer whose
  ``response.done`` was sent while its audio still plays clears the track
  (``output_audio_buffer.cleared``) and truncates the item to what was heard.
- A ``session.update`` of ``turn_detection`` mid-speech does not split one utterance's
  transcript across two item ids (B3).
- 50 paused questions over 10 sessions, with a scripted voice-activity source and the
  scripted pipeline: every dropped early answer leaves no item, no answer event before its
  turn's commit, and nothing in the pipeline.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest

from omnictl.audio import float_to_pcm16_bytes, resample
from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.outputs import Transcript
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime import vad
from omnictl.serving.realtime.session import RealtimeSession
from omnictl.serving.state import ServingState
from tests.serving.realtime.speech import sample
from tests.serving.realtime.test_live_transcription import LiveTranscriber
from tests.serving.realtime.test_webrtc_session import RATE, ask, run, served, until
from tests.serving.scripted import CHAT_ONLY, ScriptedPipeline, audio_events, text_events

# --- B1: over WebRTC, a reply done generating is still stopped by speech while it plays ------------


def test_speech_over_an_answer_still_playing_after_its_done_clears_the_track_and_cuts_the_item() -> None:
    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: audio_events(2, seconds=3.0))
        async with served(pipeline) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            done = (await call.next_of("response.done", 5))["response"]
            assert done["status"] == "completed"  # made, but 6 s of it still to play
            [answer] = done["output"]
            call.mic.say(sample("spider_legs")[: RATE * 2])  # speech over it
            await call.next_of("input_audio_buffer.speech_started", 10)
            cleared = await call.next_of("output_audio_buffer.cleared", 5)
            truncated = await call.next_of("conversation.item.truncated", 5)
            assert cleared["response_id"] == done["id"]
            assert truncated["item_id"] == answer["id"] and 0 < truncated["audio_end_ms"] < 6000, truncated
            types = [e["type"] for e in call.events]
            assert types.index("input_audio_buffer.speech_started") < types.index("output_audio_buffer.cleared")
            assert "output_audio_buffer.stopped" not in types and types.count("response.done") == 1
            # the next response hears only what was heard of it
            turn = server.server_side(call).session
            assert turn is not None
            item = turn.conversation.find(answer["id"])
            assert item is not None and item.truncated_ms == truncated["audio_end_ms"]

    run(scenario, timeout=25)


def test_speech_over_two_answers_still_playing_cuts_each_to_what_was_heard() -> None:
    """A second answer asked for while the first still plays (both done, both on the track):
    speech over them cuts the first to what was heard and the second to nothing, where the
    first was forgotten once the second started and kept words the user never heard."""

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: audio_events(2, seconds=3.0))
        async with served(pipeline) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            first = (await call.next_of("response.done", 5))["response"]
            asked = len(call.events)
            call.send({"type": "response.create"})  # while 6 s of the first still play
            second = (await call.next_of("response.done", 5, after=asked))["response"]
            assert first["status"] == second["status"] == "completed" and first["id"] != second["id"]
            call.mic.say(sample("spider_legs")[: RATE * 2])
            await call.next_of("input_audio_buffer.speech_started", 10)
            cleared = await call.next_of("output_audio_buffer.cleared", 5)
            assert cleared["response_id"] == first["id"]
            await call.next_of("conversation.item.truncated", 5)
            await until(lambda: sum(e["type"] == "conversation.item.truncated" for e in call.events) == 2,
                        "both answers truncated", 2)
            cuts = {e["item_id"]: e["audio_end_ms"] for e in call.events if e["type"] == "conversation.item.truncated"}
            [heard_first], [heard_second] = first["output"], second["output"]
            assert 0 < cuts[heard_first["id"]] < 6000 and cuts[heard_second["id"]] == 0, cuts
            assert [e["type"] for e in call.events].count("output_audio_buffer.cleared") == 1
            session = server.server_side(call).session
            assert session is not None and not session._playing_out and not session.core.playing

    run(scenario, timeout=25)


def test_speech_over_an_answer_waiting_behind_another_cuts_it_to_what_the_track_played() -> None:
    """Over WebRTC an answer may wait on the track behind one still playing (a response.create
    after the first's done): speech over it while it still generates cuts it to what the track
    played of it (nothing), where the estimate of a client playing each delta as it came counted
    the time it waited as heard."""

    async def scenario() -> None:
        pipeline = ScriptedPipeline(topology=CHAT_ONLY, script=lambda i, m: audio_events(2, seconds=3.0))
        async with served(pipeline) as server:
            call = await server.connected()
            for event in ask():
                call.send(event)
            first = (await call.next_of("response.done", 5))["response"]
            # the next answer streams a second of audio at once, then runs on until cancelled
            pipeline.script, pipeline.hold = (lambda i, m: audio_events(1, seconds=1.0)[:1]), True
            asked = len(call.events)
            call.send({"type": "response.create"})
            await call.next_of("response.output_item.added", 5, after=asked)
            await until(lambda: server.server_side(call).session.response is not None, "the answer streams", 2)
            call.mic.say(sample("spider_legs")[: RATE * 2])  # a second or more after its first audio
            await call.next_of("input_audio_buffer.speech_started", 10)
            second = (await call.next_of("response.done", 5, after=asked))["response"]
            assert second["status"] == "cancelled" and second["id"] != first["id"]
            await until(lambda: sum(e["type"] == "conversation.item.truncated" for e in call.events) == 2,
                        "both answers truncated", 2)
            cuts = {e["item_id"]: e["audio_end_ms"] for e in call.events if e["type"] == "conversation.item.truncated"}
            [heard_first], [heard_second] = first["output"], second["output"]
            assert 0 < cuts[heard_first["id"]] < 6000 and cuts[heard_second["id"]] == 0, cuts

    run(scenario, timeout=25)


# --- B3: turn detection changed mid-speech, with a live transcriber ----------------------------


def test_turn_detection_changed_mid_speech_keeps_one_item_for_the_utterance() -> None:
    from benchmarks.eval.samples import sample_question
    from omnictl.serving.realtime.vad import SileroModel

    samples, rate = sample_question("spider_legs")
    pad = np.zeros(RATE // 2, np.float32)
    spoken = float_to_pcm16_bytes(np.concatenate([pad, resample(samples, rate, RATE), pad, pad]))
    silero = SileroModel()

    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: text_events(["an", "answer"]))
        live = LiveTranscriber()
        state = ServingState(model_name="m", pipeline=pipeline, live_transcriber=live)  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []
        session = RealtimeSession(state, pipeline, lambda e: sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                                  "m", silero=lambda: silero)
        session.settings.vad = ev.ServerVad(silence_duration_ms=400)
        session._reset_vad()

        async def speak(pcm: bytes) -> None:
            for start in range(0, len(pcm), 4800):
                await session.feed(pcm[start : start + 4800])
                for _ in range(5):
                    await asyncio.sleep(0)  # the live request's task sends it on

        middle = (RATE // 2 + RATE) * 2  # a second into the question: mid-speech
        await speak(spoken[:middle])
        assert [e["type"] for e in sent].count("input_audio_buffer.speech_started") == 1
        update = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}}
        await session.handle(ev.decode_client_event(json.dumps(update)))
        await speak(spoken[middle:])
        while session._tasks:
            await asyncio.gather(*list(session._tasks), return_exceptions=True)
        of = lambda kind: [e for e in sent if e["type"] == kind]
        [started] = of("input_audio_buffer.speech_started")
        [committed] = of("input_audio_buffer.committed")
        deltas = of("conversation.item.input_audio_transcription.delta")
        [completed] = of("conversation.item.input_audio_transcription.completed")
        # before: the new detector's start named a second item; the deltas went to the first,
        # the commit and the completed transcript to the second
        assert deltas and {d["item_id"] for d in deltas} == {started["item_id"]}
        assert committed["item_id"] == completed["item_id"] == started["item_id"]
        assert len(live.requests) == 1 and [t.id for t in session.conversation.turns if t.role == "user"] == [
            started["item_id"]]
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_turn_detection_turned_on_while_audio_alone_opened_a_turn_announces_speech_and_barges_in() -> None:
    """Manual turns with audio streaming in (each append after a commit opens a turn), an answer
    in progress, then ``session.update`` turns server VAD on: the first speech the detector hears
    says ``speech_started`` and cancels the answer, and its turn is what is committed. Before,
    the turn opened by audio alone went on: no speech_started, no barge-in, and the detector's
    stop committed all the audio appended since the update under an id never announced."""

    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: text_events(["an"]), hold=True)
        state = ServingState(model_name="m", pipeline=pipeline)  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []
        session = RealtimeSession(state, pipeline, lambda e: sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                                  "m", silero=lambda: None)  # type: ignore[arg-type,return-value]
        session.settings.output_modalities = ["text"]
        session.settings.vad = None
        session._reset_vad()
        chunk = np.full(RATE // 5, 1000, "<i2").tobytes()  # 200 ms pieces

        async def client(event: dict[str, Any]) -> None:
            await session.handle(ev.decode_client_event(json.dumps(event)))

        append = {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
        await client(append)  # the manual turn opens
        for event in ask():  # a text question, answered while the turn is open
            await client(event)
        await client(append)
        assert session.response is not None
        voice = ScriptedVoice([(400.0, vad.SpeechStarted(400)), (1000.0, vad.SpeechStopped(1000))])
        original = session.listener.reset

        def scripted_reset() -> None:  # the new detector is the scripted voice
            original()
            session.listener.frontend.speech = voice  # type: ignore[assignment]
            session.listener.turns = voice  # type: ignore[assignment]

        session.listener.reset = scripted_reset  # type: ignore[method-assign]
        await client({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad"}}}}})
        for _ in range(6):
            await client(append)
        for _ in range(20):  # the cancelled answer's task sends its last events (answers hold: no waiting on all)
            await asyncio.sleep(0)
        of = lambda kind: [e for e in sent if e["type"] == kind]
        [started] = of("input_audio_buffer.speech_started")
        [stopped] = of("input_audio_buffer.speech_stopped")
        [committed] = of("input_audio_buffer.committed")
        assert started["item_id"] == stopped["item_id"] == committed["item_id"]
        [done] = [e["response"] for e in of("response.done")[:1]]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected", done["status_details"]
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


# --- 50 paused questions over 10 sessions ------------------------------------------------------


class ScriptedVoice:
    """A voice-activity source that hears what its script says, when the audio fed reaches it
    (as ``ScriptedPipeline`` answers what its script says): in the session's front end's place."""

    def __init__(self, script: list[tuple[float, vad.TurnEvent]]) -> None:
        self.script = script
        self.heard_ms = 0.0
        self.speaking = False
        self.turns = self  # it is its own turn detector

    def hear(self, raw: bytes) -> tuple[np.ndarray, list[vad.TurnEvent]]:
        before, self.heard_ms = self.heard_ms, self.heard_ms + len(raw) / 2 / RATE * 1000
        found = [event for at, event in self.script if before <= at < self.heard_ms]
        for event in found:
            if isinstance(event, vad.SpeechStarted):
                self.speaking = True
            elif isinstance(event, vad.SpeechStopped):
                self.speaking = False
        return np.zeros(len(raw) // 3, np.float32), found

    def drop_turn(self) -> None:
        self.speaking = False


def paused_question(at: float, resumed: bool) -> list[tuple[float, vad.TurnEvent]]:
    """A question spoken from ``at`` ms with a pause mid-way (an early answer starts there), then
    either resumed and paused again where it ends, or ending 300 ms past its pause."""
    start, pause = at, at + 1000  # every event 200 ms or more from the one before: one per append
    script: list[tuple[float, vad.TurnEvent]] = [
        (start, vad.SpeechStarted(int(start))), (pause, vad.SpeechPaused(int(pause)))]
    if resumed:
        end = pause + 1000
        script += [(pause + 300, vad.SpeechResumed()), (end, vad.SpeechPaused(int(end))),
                   (end + 200, vad.SpeechStopped(int(end)))]
    else:  # the stop says the turn ended elsewhere than the pause: the early answer is not this turn's
        script += [(pause + 500, vad.SpeechStopped(int(pause + 300)))]
    return script


def test_fifty_paused_questions_over_ten_sessions_leave_no_item_no_early_event_and_no_pipeline_state() -> None:
    async def one_session(pipeline: ScriptedPipeline, state: ServingState) -> None:
        sent: list[dict[str, Any]] = []
        session = RealtimeSession(state, pipeline, lambda e: sent.append(json.loads(ev.encode(e))),  # type: ignore[arg-type]
                                  "m", silero=lambda: None)  # type: ignore[arg-type,return-value]
        session.settings.output_modalities = ["text"]
        script: list[tuple[float, vad.TurnEvent]] = []
        for q in range(5):
            script += paused_question(q * 4000 + 200, resumed=q % 2 == 0)
        voice = ScriptedVoice(script)
        session.listener.frontend.speech = voice  # type: ignore[assignment]  # the scripted source hears
        session.listener.turns = voice  # type: ignore[assignment]
        chunk = np.full(RATE // 5, 1000, "<i2").tobytes()  # 200 ms pieces
        for _ in range(5 * 20):
            await session.handle(ev.decode_client_event(json.dumps(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})))
            await asyncio.sleep(0)
            if session.response is not None:  # the answer streams before the next question
                await asyncio.shield(session.response[1])
        while session._tasks:
            await asyncio.gather(*list(session._tasks), return_exceptions=True)
        types = [e["type"] for e in sent]
        assert types.count("input_audio_buffer.committed") == 5 and types.count("response.done") == 5, types
        # no answer event before its turn's commit: every response.created follows a commit of its own
        commits = [i for i, t in enumerate(types) if t == "input_audio_buffer.committed"]
        created = [i for i, t in enumerate(types) if t == "response.created"]
        assert all(c < r for c, r in zip(commits, created)) and len(created) == 5
        # no item of a dropped answer: the conversation is the 5 turns and their 5 answers, in turn
        assert [t.role for t in session.conversation.turns] == ["user", "assistant"] * 5
        added = [e["item"]["id"] for e in sent if e["type"] == "conversation.item.added"]
        assert added == [t.id for t in session.conversation.turns]
        await session.close()

    async def scenario() -> None:
        pipeline = ScriptedPipeline(script=lambda inputs, modalities: (
            [RequestEvent(RequestEventKind.RESULT, "hear", Transcript(text="what is the capital of"))]
            if modalities == ["transcript"] else text_events(["an", "answer"])))
        state = ServingState(model_name="m", pipeline=pipeline)  # type: ignore[arg-type]
        for _ in range(10):
            await one_session(pipeline, state)
        responses = [rid for _, _, rid, _, _ in pipeline.submitted if rid and rid.startswith("resp_req")]
        # every answer submitted is one a turn heard, or was aborted when dropped
        assert len(set(responses) - set(pipeline.aborts)) == 50, (len(responses), len(pipeline.aborts))
        assert state.metrics.preemptive.labels("dropped")._value.get() >= 50  # one at each question's first pause
        assert not state.active  # nothing of any request left in the server

    asyncio.run(asyncio.wait_for(scenario(), 60))


# --- a commit refused mid-turn -----------------------------------------------------------------


def test_a_refused_commit_leaves_the_turn_open_under_its_item() -> None:
    """Manual turns, transcribed while spoken: a commit refused (too little audio) leaves the
    turn as it was, so the next commit is that turn, its deltas and its transcript under one
    item id. Before, the core had ended the turn at the refused commit while the shell kept its
    live transcription: the next audio opened no turn, its deltas went out under the first id
    and the commit under a second."""
    from tests.serving.realtime.test_live_transcription import Client

    async def scenario() -> None:
        client = Client()
        await client.append(0.05)
        with pytest.raises(ev.EventError, match="at least 100 ms"):
            await client.send({"type": "input_audio_buffer.commit"})
        await client.append(0.3)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        deltas = client.of("conversation.item.input_audio_transcription.delta")
        [committed] = client.of("input_audio_buffer.committed")
        [completed] = client.of("conversation.item.input_audio_transcription.completed")
        assert deltas and {d["item_id"] for d in deltas} == {committed["item_id"]} == {completed["item_id"]}
        assert "".join(d["delta"] for d in deltas) == completed["transcript"]
        assert client.session.core.item_id is None and client.session.transcriber.live is None

    asyncio.run(asyncio.wait_for(scenario(), 5))
