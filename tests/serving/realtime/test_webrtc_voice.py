"""WebRTC against the real voice assistant: an aiortc client (loopback only) speaks a
question on its microphone track; server VAD ends the turn, the answer comes back on the
server's audio track, and Whisper hears in it the answer's text as the data channel told it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.rtc import Call, loopback_only
from tests.serving.realtime.speech import sample, silence
from tests.serving.realtime.test_realtime_turns import heard_as, words

pytestmark = pytest.mark.slow
loopback_only()


def test_a_question_spoken_on_the_microphone_track_is_answered_on_the_answer_track(
    voice_server: ServerProcess, whisper: Any
) -> None:
    async def run() -> tuple[dict[str, Any], str, str, Any]:
        call = Call()
        try:
            answer = await call.dial(voice_server.url, API_KEY)
            assert answer.status_code == 201, answer.text
            await call.opened()
            assert (await call.next_of("session.created"))["session"]["transport"] == "webrtc"
            call.send({"type": "session.update", "session": {
                "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 30,
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}})
            await call.next_of("session.updated")
            call.mic.say(silence(300) + sample("spider_legs") + silence(300))
            heard = await call.next_of("conversation.item.input_audio_transcription.completed", timeout=120)
            done = (await call.next_of("response.done", timeout=180))["response"]
            await call.next_of("output_audio_buffer.stopped", timeout=60)
            spoken = (await call.next_of("response.output_audio_transcript.done"))["transcript"]
            return done, heard["transcript"], spoken, call.heard(done["id"])
        finally:
            await call.close()

    done, question, spoken, audio = asyncio.run(run())
    assert {"spider", "legs"} <= words(question), question
    assert done["status"] == "completed" and spoken.strip()
    assert len(audio) > 24_000 * 0.5  # at least half a second of the answer was played on the track
    heard = words(whisper.transcribe(audio, 24_000))
    assert heard and len(heard_as(heard, words(spoken))) >= 0.6 * len(heard), (heard, spoken)
