"""`/v1/realtime` on the voice assistant through the official `openai` client: the history a
barge-in leaves (truncated to what was heard), transcription sessions, G.711 audio both ways."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import openai
import pytest

from omnictl.serving.realtime.formats import CODECS, ulaw_decode
from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.speech import chunks, collect_until_done, espeak, sample, silence
from tests.serving.realtime.test_realtime_turns import heard_as, words

pytestmark = pytest.mark.slow
STORY = "Tell me a long story about a dragon who lives in a castle by the sea."


@pytest.fixture()
def client(voice_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=voice_server.url + "/v1", api_key=API_KEY, max_retries=0)


def _text_item(role: str, text: str) -> dict[str, Any]:
    kind = {"user": "input_text", "assistant": "output_audio"}[role]
    return {"type": "message", "role": role, "content": [{"type": kind, ("text" if role == "user" else "transcript"): text}]}


def _prompt_tokens(connection: Any) -> int:
    connection.response.create(response={"output_modalities": ["text"], "max_output_tokens": 3})
    done = collect_until_done(connection)[-1].response
    assert done.status == "completed", done
    return int(done.usage.input_tokens)


def test_after_a_barge_in_and_a_truncate_the_next_prompt_holds_only_the_words_heard(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        # a long answer (300 tokens: seconds of generation even on vLLM), so it is still being
        # written when the barge-in is heard: the server sends audio faster than it plays
        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 300,
                                           "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}}})
        assert connection.recv().type == "session.updated"
        connection.conversation.item.create(item=_text_item("user", STORY))
        connection.response.create()
        sent_ms, said = 0.0, []
        while sent_ms < 1000:  # let 1 s of the answer go out
            event = connection.recv()
            assert event.type != "response.done", event
            if event.type == "response.output_audio.delta":
                sent_ms += len(base64.b64decode(event.delta)) / 48
                item_id = event.item_id
            elif event.type == "response.output_audio_transcript.delta":
                said.append(event.delta)
        for audio in chunks(sample("sky_colour") + silence(1200)):  # the user talks over it (then the 700 ms that end the turn)
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
        done = next(e for e in events if e.type == "response.done").response
        assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
        # without a truncate from the client the server cut the item at its own estimate
        estimate = next(e for e in events if e.type == "conversation.item.truncated")
        assert estimate.item_id == item_id and 0 < estimate.audio_end_ms <= sent_ms + 1
        question = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
        connection.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=300)
        while (event := connection.recv()).type != "conversation.item.truncated":
            assert event.type != "error", event
        assert event.audio_end_ms == 300
        connection.conversation.item.retrieve(item_id=item_id)
        while (event := connection.recv()).type != "conversation.item.retrieved":
            pass
        heard = event.item.content[0].transcript
        full = "".join(said + [e.delta for e in events if e.type == "response.output_audio_transcript.delta"])
        assert len(heard.split()) < len(full.split()) and words(heard) <= words(full), (heard, full)
        truncated_prompt = _prompt_tokens(connection)
    # the same conversation built by hand with only the heard words: the same prompt, token for token
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        for role, text in (("user", STORY), ("assistant", heard), ("user", question)):
            connection.conversation.item.create(item=_text_item(role, text))
        assert _prompt_tokens(connection) == truncated_prompt
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        for role, text in (("user", STORY), ("assistant", full), ("user", question)):
            connection.conversation.item.create(item=_text_item(role, text))
        assert _prompt_tokens(connection) > truncated_prompt  # the whole answer would have weighed more


def test_a_transcription_session_hears_a_spoken_question(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="voice-assistant", extra_query={"intent": "transcription"}) as connection:
        created = connection.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        connection.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}})
        updated = connection.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.transcription is not None
        for audio in chunks(silence(300) + espeak("How many legs does a spider have?") + silence(900)):
            connection.input_audio_buffer.append(audio=audio)
        events = []
        while (event := connection.recv()).type != "conversation.item.input_audio_transcription.completed":
            events.append(event)
        types = [e.type for e in events]
    assert {"input_audio_buffer.speech_started", "input_audio_buffer.committed"} <= set(types)
    assert "conversation.item.input_audio_transcription.delta" in types and "response.created" not in types
    assert {"spider", "legs"} <= words(event.transcript), event.transcript


def test_g711_in_and_out_round_trips_speech_whisper_still_transcribes(client: openai.OpenAI, whisper: Any) -> None:
    raw = CODECS["audio/pcma"].from_pcm16(espeak("What is the capital of France?"))  # 8 kHz A-law, as a phone sends
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 30,
                                           "audio": {"input": {"format": {"type": "audio/pcma"}, "turn_detection": None},
                                                     "output": {"format": {"type": "audio/pcmu"}}}})
        updated = connection.recv()
        assert updated.session.audio.input.format.type == "audio/pcma"
        assert updated.session.audio.output.format.type == "audio/pcmu"
        for start in range(0, len(raw), 800):  # 100 ms at 8 kHz
            connection.input_audio_buffer.append(audio=base64.b64encode(raw[start:start + 800]).decode())
        connection.input_audio_buffer.commit()
        connection.response.create()
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
    assert "france" in words(heard), heard
    answer = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert len(answer) > 8_000  # over a second of 8-bit samples at 8 kHz
    pcm = ulaw_decode(np.frombuffer(answer, np.uint8)).astype(np.float32) / 32768.0  # 8 kHz mu-law
    heard_in_answer = words(whisper.transcribe(pcm, 8_000))
    assert heard_in_answer and len(heard_as(heard_in_answer, words(said))) >= 0.6 * len(heard_in_answer), (heard_in_answer, said)


def test_semantic_vad_keeps_a_paused_question_one_turn_and_answers_it(client: openai.OpenAI) -> None:
    from benchmarks.realtime_turn_detection import question, with_pause

    paused = with_pause(question("spider_legs"), 900)  # "How many legs does a spider ... have?"
    pcm = (np.clip(paused, -1, 1) * 32767).astype("<i2").tobytes()
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 20,
                                           "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}}}})
        updated = connection.recv()
        assert updated.type == "session.updated", updated
        assert updated.session.audio.input.turn_detection.type == "semantic_vad"
        for audio in chunks(silence(300) + pcm + silence(1500)):
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
    types = [e.type for e in events]
    assert types.count("input_audio_buffer.committed") == 1, types
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
    assert {"spider", "have"} <= words(heard), heard
    assert next(e for e in events if e.type == "response.done").response.status == "completed"


class _Speaker:
    """A client's loudspeaker: each answer delta plays when it arrives (or after what is still playing)."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[float, np.ndarray]] = []
        self.end = 0.0

    def play(self, delta: str, now: float) -> None:
        samples = np.frombuffer(base64.b64decode(delta), "<i2").astype(np.float32) / 32768.0
        start = max(self.end, now)
        self.scheduled.append((start, samples))
        self.end = start + samples.size / 24_000

    def sound(self, begin: float, samples: int) -> np.ndarray:
        """What it played from ``begin`` on, ``samples`` at 24 kHz."""
        out = np.zeros(samples, np.float32)
        for start, audio in self.scheduled:
            offset = int(round((start - begin) * 24_000))
            lo, hi = max(0, offset), min(samples, offset + audio.size)
            if lo < hi:
                out[lo:hi] += audio[lo - offset : hi - offset]
        return out


def _echoing_client(voice_server: ServerProcess, guard: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A raw WebSocket client with no echo cancellation: its microphone hears its loudspeaker
    (the answer, 200 ms late, at 40 %), appended in real time for 3 s; then the user speaks over
    it. (The events before the user spoke, every event up to response.done.) Without the guard
    it stops as soon as the echo is heard as speech, before the user speaks."""
    import json
    import threading
    import time

    from websockets.sync.client import connect

    url = voice_server.url.replace("http://", "ws://") + "/v1/realtime?model=voice-assistant"
    interruption = np.frombuffer(espeak("Stop. What time is it now?"), "<i2").astype(np.float32) / 32768.0
    with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"],
                                                                  "max_output_tokens": 200,
                                                                  "audio": {"input": {"echo_guard": guard}}}}))
        ws.send(json.dumps({"type": "conversation.item.create", "item": _text_item("user", STORY)}))
        ws.send(json.dumps({"type": "response.create"}))
        speaker, events, tick = _Speaker(), [], 0.1
        started: float | None = None
        before: list[dict[str, Any]] | None = None
        speak_at, step = 2.5, 2_400  # s of echo alone, then the user talks over it; 100 ms appends
        lock, reading = threading.Lock(), threading.Event()

        def read() -> None:  # its own thread: each delta plays the moment it arrives, as a real client's
            nonlocal started
            while not reading.is_set():
                try:
                    event = json.loads(ws.recv(timeout=0.05))
                except TimeoutError:
                    continue
                with lock:
                    events.append(event)
                    if event["type"] == "response.output_audio.delta":
                        speaker.play(event["delta"], time.monotonic())
                        started = started or time.monotonic()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        next_at = time.monotonic()
        for _ in range(200):
            now = next_at  # the microphone's clock: it records without a gap, however late an append goes out
            if started and now - started >= speak_at + 3:  # the answer may be all sent: it still plays
                break
            with lock:
                if not guard and any(e["type"] == "input_audio_buffer.speech_started" for e in events):
                    break  # unguarded, the echo barged in: the user never gets to speak
                mic = 0.4 * speaker.sound(now - tick - 0.2, step)  # the echo
                if started is not None and now - started >= speak_at:
                    before = list(events) if before is None else before
                    k = int((now - started - speak_at) / tick)
                    mic[: interruption[k * step : (k + 1) * step].size] += interruption[k * step : (k + 1) * step]
            ws.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode((np.clip(mic, -1, 1) * 32767).astype("<i2").tobytes()).decode()}))
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
        reading.set()
        reader.join()
        while not any(e["type"] == "response.done" for e in events):
            events.append(json.loads(ws.recv(timeout=60)))
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))  # a marker: every event before it comes first
        while events[-1]["type"] != "input_audio_buffer.cleared":
            events.append(json.loads(ws.recv(timeout=60)))
    return (events if before is None else before), events


def test_the_answers_own_echo_does_not_barge_in_and_another_voice_does(voice_server: ServerProcess) -> None:
    before, events = _echoing_client(voice_server, guard=True)
    judged = [line for line in voice_server.text().splitlines() if "echo" in line]
    assert not [e for e in before if e["type"] == "input_audio_buffer.speech_started"], ("the echo barged in", judged[-5:])
    types = [e["type"] for e in events[len(before):]]
    assert "input_audio_buffer.speech_started" in types, types  # the user's voice over the echo is heard
    order = [e["type"] for e in events]
    heard_at = len(before) + types.index("input_audio_buffer.speech_started")
    done_at = order.index("response.done")
    done = events[done_at]["response"]
    # Still answering when the user's speech was heard (the guard judges it 400 ms after it
    # starts; an answer may end generating meanwhile, then it completed): barge-in.
    if done_at > heard_at:
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected", done
    # the same echo without the guard: the answer interrupts itself
    before, _ = _echoing_client(voice_server, guard=False)
    assert [e for e in before if e["type"] == "input_audio_buffer.speech_started"], "this echo is not heard as speech"
