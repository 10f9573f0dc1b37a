from __future__ import annotations

from typing import Any

import base64
import io
import wave

import numpy as np

from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.serving.chat.responses import ChunkTranslator, build_completion
from omnictl.serving.chat.sse import DONE, sse_event

TONE = np.full(1600, 0.25, dtype=np.float32)


def delta(chunk: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = chunk["choices"][0]["delta"]
    return found


def test_streamed_text_and_audio_deltas_then_usage() -> None:
    t = ChunkTranslator("chatcmpl-1", "m", "wav")
    assert delta(t.first()) == {"role": "assistant", "content": ""}
    assert [delta(c) for c in t.on_stream("decode", TextDelta(text="Hi"))] == [{"content": "Hi"}]
    first_audio = delta(t.on_stream("tts", AudioChunk(samples=TONE, sample_rate=16000, transcript="Hi"))[0])["audio"]
    second_audio = delta(t.on_stream("tts", AudioChunk(samples=TONE, sample_rate=16000, transcript=" there"))[0])["audio"]
    assert base64.b64decode(first_audio["data"])[:4] == b"RIFF"  # one header, then raw samples
    assert len(base64.b64decode(second_audio["data"])) == 3200
    assert first_audio["id"] == second_audio["id"] and first_audio["transcript"] == "Hi"
    # results of terminals that streamed add nothing new; they carry usage and the finish reason
    assert t.on_result("decode", TextResult(text="Hi", prompt_tokens=3, completion_tokens=1, finish_reason="length")) == []
    assert t.on_result("tts", AudioResult(samples=TONE, sample_rate=16000, transcript="Hi there")) == []
    last = t.last()
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_a_terminal_that_never_streamed_sends_its_result_as_one_delta() -> None:
    t = ChunkTranslator("chatcmpl-2", "m", "pcm16")
    assert [delta(c) for c in t.on_result("decode", TextResult(text="whole answer"))] == [{"content": "whole answer"}]
    audio = delta(t.on_result("tts", AudioResult(samples=TONE, sample_rate=24000, transcript="x"))[0])["audio"]
    assert len(base64.b64decode(audio["data"])) == 3200


def test_non_streamed_completion() -> None:
    body = build_completion("chatcmpl-3", "m", {
        "decode": TextResult(text="Paris.", prompt_tokens=7, completion_tokens=2),
        "tts": AudioResult(samples=TONE, sample_rate=16000, transcript="Paris."),
        "extra": {"free": "form"},  # a custom modality: not part of a chat completion
    }, "wav")
    message = body["choices"][0]["message"]
    assert message["content"] == "Paris." and message["audio"]["transcript"] == "Paris."
    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as wav:
        assert wav.getnframes() == 1600
    assert body["usage"]["total_tokens"] == 9 and body["object"] == "chat.completion"


def test_sse_framing() -> None:
    assert sse_event({"a": "é\n"}) == b'data: {"a":"\xc3\xa9\\n"}\n\n'
    assert DONE == b"data: [DONE]\n\n"


def test_streamed_pcm16_audio_deltas_are_24k_raw_samples() -> None:
    t = ChunkTranslator("chatcmpl-4", "m", "pcm16")
    deltas = [delta(t.on_stream("tts", AudioChunk(samples=TONE, sample_rate=16000, transcript="x"))[0])["audio"]
              for _ in range(2)]
    samples = [np.frombuffer(base64.b64decode(d["data"]), "<i2") for d in deltas]
    assert [s.size for s in samples] == [2400, 2400]  # 1600 samples at 16 kHz = 0.1 s = 2400 at 24 kHz
    assert all(set(s) == {8192} for s in samples)  # 0.25 full scale, no header in front
