from __future__ import annotations

import io
import wave

import numpy as np

from omnictl.serving.speech.encode import PCM16_RATE, AudioStreamEncoder, encode_whole, resample


def sine(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_whole_wav_is_a_readable_file_at_the_stage_rate() -> None:
    data = encode_whole(sine(0.5, 16000), 16000, "wav")
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        assert wav.getnframes() == 8000
        frames = np.frombuffer(wav.readframes(8000), "<i2")
    assert abs(int(frames.max()) - 16384) < 50


def test_pcm16_is_resampled_to_24k() -> None:
    data = encode_whole(sine(1.0, 22050), 22050, "pcm16")
    assert len(data) == 2 * PCM16_RATE


def test_clipping() -> None:
    data = encode_whole(np.array([2.0, -2.0], np.float32), PCM16_RATE, "pcm16")
    assert list(np.frombuffer(data, "<i2")) == [32767, -32767]


def test_streamed_wav_has_one_header_and_counts_seconds() -> None:
    encoder = AudioStreamEncoder("wav")
    first = encoder.encode(sine(0.25, 16000), 16000)
    second = encoder.encode(sine(0.25, 16000), 16000)
    assert first[:4] == b"RIFF" and second[:4] != b"RIFF"
    assert len(first) == 44 + 8000 and len(second) == 8000
    assert encoder.seconds == 0.5


def test_resample_keeps_duration() -> None:
    out = resample(sine(1.0, 16000), 16000, 24000)
    assert out.size == 24000 and out.dtype == np.float32


def test_streamed_pcm16_is_resampled_to_24k_with_no_header() -> None:
    encoder = AudioStreamEncoder("pcm16")
    chunks = [encoder.encode(np.full(4000, 0.5, np.float32), 16000) for _ in range(2)]
    assert [len(chunk) for chunk in chunks] == [2 * 6000, 2 * 6000]  # 0.25 s each at 24 kHz
    assert all(set(np.frombuffer(chunk, "<i2")) == {16384} for chunk in chunks)  # no RIFF bytes
    assert encoder.seconds == 0.5  # counted at the stage's rate, not the wire's
