"""`/v1/realtime` through the official `openai` client (`client.realtime.connect`) against a
real `omnictl serve` of the embedded voice assistant: spoken questions in, answers out."""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterator

import openai
import pytest

from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.speech import chunks, collect_until_done, espeak, sample, samples_of, silence


@pytest.fixture()
def client(voice_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=voice_server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture()
def manual(client: openai.OpenAI) -> Iterator[Any]:
    """A session with manual turns (no server VAD) answering in text and audio."""
    with client.realtime.connect(model="voice-assistant") as connection:
        created = connection.recv()
        assert created.type == "session.created" and created.session.audio.input.turn_detection.type == "server_vad"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text", "audio"],
                                           "audio": {"input": {"turn_detection": None}}, "max_output_tokens": 40})
        updated = connection.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.turn_detection is None
        yield connection


_NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve".split()))


def words(text: str) -> set[str]:
    """The words in ``text``, lower case, numerals spelled out (Whisper writes "8" for "eight")."""
    text = re.sub(r"\d+", lambda m: f" {_NUMBERS.get(int(m.group()), m.group())} ", text.lower())
    return set(re.findall(r"[a-z]+", text))


def heard_as(heard: set[str], said: set[str]) -> set[str]:
    """The words of ``heard`` that are, or sound like, words of ``said``: Piper's voice varies from
    one synthesis to the next, so Whisper may hear "legs" as "lugs"."""
    return {w for w in heard if w in said or difflib.get_close_matches(w, said, n=1, cutoff=0.75)}


def test_a_spoken_question_committed_by_hand_is_heard_and_answered_in_text_and_speech(manual: Any, whisper: Any) -> None:
    for audio in chunks(espeak("How many legs does a spider have?")):
        manual.input_audio_buffer.append(audio=audio)
    manual.input_audio_buffer.commit()
    manual.response.create()
    events = collect_until_done(manual, also=("conversation.item.input_audio_transcription.completed",))
    types = [e.type for e in events]
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert heard.item_id == committed.item_id
    assert {"spider", "legs"} <= words(heard.transcript), heard.transcript
    text_deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    text = "".join(text_deltas)
    assert len(text_deltas) > 3 and len(words(text)) > 3  # streamed, token by token
    assert next(e for e in events if e.type == "response.output_text.done").text == text
    audio = [e.delta for e in events if e.type == "response.output_audio.delta"]
    spoken = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert audio and words(spoken) <= words(text)
    # the audio says the text's answer: most of what Whisper hears in it is words of the text
    heard_in_answer = words(whisper.transcribe(samples_of(audio), 24_000))
    assert len(heard_as(heard_in_answer, words(text))) >= 0.6 * len(heard_in_answer), (heard_in_answer, text)
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "completed" and done.usage.output_tokens > 0 and done.usage.input_tokens > 0
    assert done.output[0].role == "assistant" and done.output[0].content[0].transcript == spoken
    order = ["input_audio_buffer.committed", "conversation.item.added", "response.created", "response.output_item.added",
             "response.content_part.added", "response.output_audio.delta", "response.output_audio.done",
             "response.output_item.done", "response.done"]
    firsts = [types.index(t) for t in order]
    assert firsts == sorted(firsts), types
    assert types.index("response.output_audio.done") > max(i for i, t in enumerate(types) if t == "response.output_audio.delta")
    assert types.index("response.done") > max(i for i, t in enumerate(types) if t == "response.output_audio.delta")


def test_each_response_hears_the_whole_conversation(manual: Any) -> None:
    manual.conversation.item.create(item={"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "My name is Ada."}]})
    assert manual.recv().type == "conversation.item.added" and manual.recv().type == "conversation.item.done"
    manual.response.create(response={"output_modalities": ["text"]})
    first = collect_until_done(manual)[-1].response
    assert first.status == "completed"
    for audio in chunks(sample("capital_of_france")):  # a spoken turn: it is remembered as what was heard
        manual.input_audio_buffer.append(audio=audio)
    manual.input_audio_buffer.commit()
    manual.response.create(response={"output_modalities": ["text"]})
    events = collect_until_done(manual, also=("conversation.item.input_audio_transcription.completed",))
    assert not any(e.type == "response.output_audio.delta" for e in events)
    second = next(e for e in events if e.type == "response.done").response
    assert "Paris" in second.output[0].content[0].text
    # the prompt held the first question and its answer besides the new question
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens + 5
    manual.conversation.item.create(item={"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "Thank you."}]})
    manual.response.create(response={"output_modalities": ["text"]})
    third = collect_until_done(manual)[-1].response
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_server_vad_answers_when_the_speaker_stops(client: openai.OpenAI, whisper: Any) -> None:
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 30,
                                           "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}})
        assert connection.recv().type == "session.updated"
        for audio in chunks(silence(500) + sample("spider_legs") + silence(1000)):
            connection.input_audio_buffer.append(audio=audio)  # and never a commit
        events = collect_until_done(connection, also=("conversation.item.input_audio_transcription.completed",))
    types = [e.type for e in events]
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    assert 300 <= started.audio_start_ms <= 800 and stopped.audio_end_ms > started.audio_start_ms + 1000
    assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed") < types.index("response.created")
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "spider" in heard.transcript.lower()
    assert next(e for e in events if e.type == "response.done").response.status == "completed"
    assert not any(e.type == "response.output_text.delta" for e in events)  # audio only, as asked
    audio = [e.delta for e in events if e.type == "response.output_audio.delta"]
    assert audio and whisper.transcribe(samples_of(audio), 24_000).strip()


def test_with_server_defaults_the_turn_is_transcribed_while_spoken_and_answered(client: openai.OpenAI) -> None:
    """Issue 46: the served voice assistant listens itself (one Whisper, no live transcriber):
    a session left as created, a question streamed in real time, gets transcription deltas
    before its speech ends, which add up to the turn's transcript, and is answered."""
    import threading
    import time

    pcm = silence(300) + sample("capital_of_france")
    with client.realtime.connect(model="voice-assistant") as connection:
        assert connection.recv().type == "session.created"  # its defaults, unchanged
        events: list[tuple[float, Any]] = []
        finished = threading.Event()

        def read() -> None:
            try:
                while not finished.is_set():
                    event = connection.recv()
                    events.append((time.perf_counter(), event))
                    if event.type in ("response.done", "error"):
                        finished.set()
            finally:
                finished.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for audio in chunks(pcm):
            connection.input_audio_buffer.append(audio=audio)
            time.sleep(0.1)  # real time
        spoken = time.perf_counter()
        for audio in chunks(silence(1500)):
            connection.input_audio_buffer.append(audio=audio)
            time.sleep(0.1)
        assert finished.wait(120), [e.type for _, e in events]
        reader.join(5)
    deltas = [(at, e) for at, e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    [completed] = [e for _, e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert any(at < spoken for at, _ in deltas), [e.type for _, e in events]  # words while speaking
    assert "".join(e.delta for _, e in deltas) == completed.transcript
    assert "france" in completed.transcript.lower()
    assert [e for _, e in events if e.type == "response.done"][0].response.status == "completed"
