from __future__ import annotations

import base64
import io
import time
import wave
from typing import Any

import numpy as np

from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.serving.chat.responses import AUDIO_TTL_S, ChunkTranslator, build_completion
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


# --- the shapes, as OpenAI's own client reads them ----------------------------------------


def test_a_completion_is_openai_s_shape_key_for_key() -> None:
    from openai.types.chat import ChatCompletion

    before = int(time.time())
    body = build_completion("chatcmpl-4", "m", {
        "decode": TextResult(text="Paris.", prompt_tokens=7, completion_tokens=2, finish_reason="length"),
        "tts": AudioResult(samples=TONE, sample_rate=16000, transcript="Paris."),
    }, "wav")
    parsed = ChatCompletion.model_validate(body)  # every required field, by its name
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert (parsed.id, parsed.object, parsed.model) == ("chatcmpl-4", "chat.completion", "m")
    assert before <= parsed.created <= int(time.time())
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "finish_reason"} and choice["index"] == 0
    assert choice["finish_reason"] == "length"
    message = choice["message"]
    assert set(message) == {"role", "content", "audio"} and message["role"] == "assistant"
    audio = message["audio"]
    assert set(audio) == {"id", "data", "transcript", "expires_at"} and audio["id"].startswith("audio_")
    assert audio["expires_at"] == body["created"] + AUDIO_TTL_S
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    # with no text terminal, the content is null (as OpenAI's audio-only answers), not missing
    spoken = build_completion("chatcmpl-5", "m", {"tts": AudioResult(samples=TONE, sample_rate=16000)}, "wav")
    assert spoken["choices"][0]["message"]["content"] is None and "content" in spoken["choices"][0]["message"]
    assert spoken["choices"][0]["finish_reason"] == "stop"


def test_every_chunk_is_openai_s_shape_and_a_compressed_stream_ends_with_its_tail() -> None:
    from openai.types.chat import ChatCompletionChunk

    before = int(time.time())
    t = ChunkTranslator("chatcmpl-6", "m", "mp3")
    chunks = [t.first(), *t.on_stream("decode", TextDelta(text="Hi")),
              *t.on_stream("tts", AudioChunk(samples=np.tile(TONE, 10), sample_rate=16000, transcript="Hi")),
              *t.tail(), t.last()]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert set(chunk) - {"usage"} == {"id", "object", "created", "model", "choices"}
        assert (chunk["id"], chunk["object"], chunk["model"]) == ("chatcmpl-6", "chat.completion.chunk", "m")
        assert before <= chunk["created"] <= int(time.time()) and chunk["created"] == t.created
        assert set(chunk["choices"][0]) == {"index", "delta", "finish_reason"} and chunk["choices"][0]["index"] == 0
    audio = [delta(c)["audio"] for c in chunks if "audio" in delta(c)]
    assert len(audio) == 2  # the encoder's frames, then what it still held at the end
    for part in audio:
        assert set(part) == {"id", "data", "transcript", "expires_at"}
        assert part["id"] == t.audio_id and part["expires_at"] == t.created + AUDIO_TTL_S
    assert audio[1]["transcript"] == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]


def test_a_stream_without_audio_has_no_tail() -> None:
    t = ChunkTranslator("chatcmpl-7", "m", "mp3")
    t.on_stream("decode", TextDelta(text="Hi"))
    assert t.tail() == []


def test_streamed_audio_transcripts_join_with_a_space_between_the_pieces() -> None:
    t = ChunkTranslator("chatcmpl-1", "m", "pcm16")
    pieces = ["The capital of France", "is Paris,", " as", "everyone knows."]
    sent = [delta(t.on_stream("tts", AudioChunk(samples=TONE, sample_rate=16000, transcript=p))[0])["audio"]["transcript"]
            for p in pieces]
    assert "".join(sent) == "The capital of France is Paris, as everyone knows."
