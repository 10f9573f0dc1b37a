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


def _decoded(data: bytes) -> tuple[str, int]:
    """(codec, samples) of a file as FFmpeg (PyAV) reads it back."""
    import av

    with av.open(io.BytesIO(data)) as container:
        codec = container.streams.audio[0].codec_context.name
        return codec, sum(frame.samples for frame in container.decode(audio=0))


def test_no_samples_are_a_file_of_no_samples_where_the_format_has_one() -> None:
    # What each format gives for an answer with nothing to pronounce ("...", an emoji): WAV and
    # FLAC have a file header, so a file of 0 samples (a WAV was "" before: FFmpeg writes the
    # header with the first packet); pcm16 is raw samples, mp3 and aac (ADTS) are frames with
    # no file header, and Ogg Opus's header pages alone do not open in FFmpeg: no bytes.
    nothing = np.zeros(0, np.float32)
    whole = {fmt: encode_whole(nothing, 22050, fmt) for fmt in ("wav", "flac", "pcm16", "mp3", "aac", "opus")}
    with wave.open(io.BytesIO(whole["wav"])) as wav:
        assert (wav.getframerate(), wav.getnframes(), len(whole["wav"])) == (22050, 0, 44)
    assert _decoded(whole["wav"]) == ("pcm_s16le", 0) and _decoded(whole["flac"]) == ("flac", 0)
    assert whole["pcm16"] == whole["mp3"] == whole["aac"] == whole["opus"] == b""
    for fmt in whole:  # streamed: the same, from the encoder's finish (the chunk itself gives nothing)
        encoder = AudioStreamEncoder(fmt)
        assert encoder.encode(nothing, 22050) == b""
        streamed = encoder.finish()
        assert len(streamed) == len(whole[fmt]), fmt  # a streamed WAV's sizes say 'unknown' instead
        if streamed:
            assert _decoded(streamed)[1] == 0, fmt
