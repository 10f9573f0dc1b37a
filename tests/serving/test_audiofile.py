"""Uploaded audio files: whatever FFmpeg decodes, decoded once, limits checked before decoding."""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest

from benchmarks.eval.samples import sample_path
from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.inputs import read_wav
from tests.serving.ffprobe import FFMPEG, convert, needs_ffmpeg

pytestmark = needs_ffmpeg
QUESTION = sample_path("spider_legs").read_bytes()  # a WAV at 16 kHz


def seconds_of(wav: bytes) -> float:
    samples, rate = read_wav(wav)
    return samples.size / rate


@pytest.mark.parametrize("suffix,args", [("mp3", ()), ("ogg", ("-c:a", "libopus")), ("webm", ()), ("m4a", ()),
                                         ("flac", ())])
def test_the_formats_browsers_and_phones_record_decode_to_the_same_audio(suffix: str, args: tuple[str, ...]) -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    samples, rate = decode_audio_file(convert(QUESTION, suffix, *args), "file", 600)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert samples.size / rate == pytest.approx(seconds_of(QUESTION), abs=0.08)  # codec padding: tens of ms
    assert 0.05 < float(np.abs(samples).max()) <= 1.0  # speech, not silence


def test_wav_goes_through_the_wav_reader() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    samples, rate = decode_audio_file(QUESTION, "file", 600)
    expected, expected_rate = read_wav(QUESTION)
    assert rate == expected_rate and np.array_equal(samples, expected)


@pytest.mark.parametrize("data", [b"ID3\x03\x00\x00\x00\x00\x00\x00" + os.urandom(4000), b"plain text, not audio",
                                  b""])
def test_a_corrupt_file_is_refused_naming_the_field(data: bytes) -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    with pytest.raises(InvalidRequest) as error:
        decode_audio_file(data, "file", 600)
    assert error.value.field == "file" and not isinstance(error.value, PayloadTooLarge)


def claims_hours(mp3: bytes) -> bytes:
    """An mp3 whose Xing/Info header claims 16 million frames (days), holding two seconds."""
    data = bytearray(mp3)
    tag = max(data.find(b"Info"), data.find(b"Xing"))
    assert tag > 0, "ffmpeg's mp3 muxer writes an Info tag"
    assert data[tag + 7] & 1, "the tag carries a frame count"
    data[tag + 8 : tag + 12] = (0x00FFFFFF).to_bytes(4, "big")
    return bytes(data)


def test_a_header_claiming_hours_is_refused_before_decoding() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    assert FFMPEG is not None
    lying = claims_hours(convert(QUESTION, "mp3"))
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge) as error:
        decode_audio_file(lying, "file", 600)
    assert error.value.field == "file" and "header says" in str(error.value)
    assert time.perf_counter() - started < 0.5


def test_audio_longer_than_the_limit_is_refused_while_decoding() -> None:
    from omnictl.serving.speech.encode import AudioStreamEncoder
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    encoder = AudioStreamEncoder("flac")  # a streamed FLAC: its header does not know its length
    samples, rate = read_wav(QUESTION)
    flac = encoder.encode(samples, rate) + encoder.finish()
    with pytest.raises(PayloadTooLarge) as error:
        decode_audio_file(flac, "file", 1.0)
    assert error.value.field == "file" and "lasts over" in str(error.value)


def test_a_file_without_audio_is_refused() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    assert FFMPEG is not None
    video = subprocess.run([FFMPEG, "-v", "error", "-f", "lavfi", "-i", "color=c=black:s=16x16:d=0.2", "-f", "webm", "-"],
                           capture_output=True, check=True, timeout=60).stdout
    with pytest.raises(InvalidRequest, match="no audio stream"):
        decode_audio_file(video, "file", 600)


def _wav(samples: np.ndarray, rate: int = 16_000) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "limit", "refusal", "message"),
    [
        (b"", 600, InvalidRequest, "'file' is empty"),
        (b"plain text, not audio", 600, InvalidRequest,
         "'file' is not an audio file FFmpeg can read ([Errno 1094995529] Invalid data found when processing input)"),
        (_wav(np.zeros(0)), 600, InvalidRequest, "'file' holds no audio"),
        (_wav(np.zeros(16_000 * 3)), 1.0, PayloadTooLarge, "'file' is too long: it lasts over 3 s; the limit is 1 s"),
    ],
)
def test_each_refusal_is_one_sentence_naming_the_field(data: bytes, limit: float, refusal: type[Exception],
                                                       message: str) -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    with pytest.raises(refusal) as error:
        decode_audio_file(data, "file", limit)
    assert type(error.value) is refusal
    assert (str(error.value), error.value.field) == (message, "file")  # type: ignore[attr-defined]


def test_the_limits_say_whether_the_header_or_the_audio_was_too_long() -> None:
    from omnictl.serving.speech.encode import AudioStreamEncoder
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    with pytest.raises(PayloadTooLarge) as claimed:
        decode_audio_file(claims_hours(convert(QUESTION, "mp3")), "file", 600)
    assert str(claimed.value) == "'file' is too long: its header says it lasts 603980 s; the limit is 600 s"
    encoder = AudioStreamEncoder("flac")
    samples, rate = read_wav(QUESTION)
    with pytest.raises(PayloadTooLarge) as decoded:
        decode_audio_file(encoder.encode(samples, rate) + encoder.finish(), "upload", 1.0)
    assert (str(decoded.value), decoded.value.field) == ("'upload' is too long: it lasts over 1 s; the limit is 1 s", "upload")


def test_a_wav_exactly_at_the_limit_is_taken() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    samples, rate = decode_audio_file(_wav(np.full(16_000, 1000)), "file", 1.0)
    assert (rate, samples.size) == (16_000, 16_000) and samples.dtype == np.float32
