"""Stages for the abort tests over HTTP: every endpoint (chat, realtime, speech,
transcriptions) on plain functions, each terminal slow enough that an abort, not the
work's end, is what stops it.

``front`` takes a chat request, a speech request or a transcription's audio and routes
it; the word "slowly" makes the text and audio terminals (the fast HTTP tests' ones)
stream for :data:`WORK_S`; ``hear`` streams one segment per :data:`SEGMENT_S` of audio,
:data:`tests.serving.fast_stages.SLOW_CHUNK_S` apart. Every terminal is a generator: an
abort stops it at its next chunk, so the stage is free again at once."""

from __future__ import annotations

import time
from typing import Any, Callable, Generator

from omnictl.inputs import AudioPart, SpeechRequest, TextPart, as_chat_request
from omnictl.outputs import Transcript, TranscriptSegment
from tests.serving.fast_stages import SLOW_CHUNK_S, SLOW_WORDS

WORK_S = SLOW_CHUNK_S * SLOW_WORDS  # what a slow answer or spoken reply takes
SEGMENT_S = 0.25  # seconds of audio per transcript segment
AUDIO_S = SLOW_WORDS * SEGMENT_S  # the audio `hear` takes WORK_S on


def front() -> Callable[[Any], dict[str, Any]]:
    def run(data: Any) -> dict[str, Any]:
        if isinstance(data, SpeechRequest):
            words, speech, samples, rate = data.text.split(), True, 0, 0
        else:
            message = as_chat_request(data).last_user_message()
            parts = message.parts if message is not None else ()
            words = [word for part in parts if isinstance(part, TextPart) for word in part.text.split()]
            audio = [part for part in parts if isinstance(part, AudioPart)]
            speech, samples = False, sum(part.samples.size for part in audio)
            rate = audio[-1].sample_rate if audio else 0
        slow = "slowly" in words
        if slow:
            words += ["and"] * SLOW_WORDS
        return {"words": ["echo:", *words], "slow": slow, "prompt_tokens": len(words), "speech": speech,
                "samples": samples, "rate": rate}

    return run


def route(data: dict[str, Any]) -> list[str]:
    """Speech goes to the audio terminal alone; the rest everywhere the request runs."""
    return ["speak"] if data["speech"] else ["answer", "speak", "hear"]


def hear() -> Callable[[dict[str, Any]], Generator[Transcript, None, Transcript]]:
    def run(data: dict[str, Any]) -> Generator[Transcript, None, Transcript]:
        seconds = data["samples"] / data["rate"] if data["rate"] else 0.0
        segments = []
        for index in range(int(seconds / SEGMENT_S)):
            time.sleep(SLOW_CHUNK_S)
            segment = TranscriptSegment(id=index, start=index * SEGMENT_S, end=(index + 1) * SEGMENT_S, text=" tone")
            segments.append(segment)
            yield Transcript(text=segment.text, segments=[segment])
        return Transcript(text="".join(s.text for s in segments).strip(), duration=seconds, segments=segments)

    return run
