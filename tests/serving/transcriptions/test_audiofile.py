"""Uploaded audio files: whatever FFmpeg decodes, decoded once, limits checked before decoding."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.eval.samples import sample_path
from omnictl.exceptions import DecodeCancelled, InvalidRequest, PayloadTooLarge
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
         "'file' is not an audio file of a format taken here "
         "(wav, mp3, aac, mp4/m4a, ogg, webm/matroska, flac, caf, aiff, amr)"),
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


# --- untrusted media stays media (issue 40) ------------------------------------------------


def flac_of(seconds: float, rate: int, channels: int = 1) -> bytes:
    """Silence as FLAC, by the ffmpeg command line (compresses to almost nothing; into a
    file, so that its header says how long it is)."""
    assert FFMPEG is not None
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "silence.flac"
        subprocess.run([FFMPEG, "-v", "error", "-f", "lavfi", "-i", f"anullsrc=r={rate}:cl={channels}c",
                        "-t", str(seconds), "-c:a", "flac", "-frame_size", "65535", str(target)],
                       capture_output=True, check=True, timeout=120)
        return target.read_bytes()


def without_total(flac: bytes) -> bytes:
    """The FLAC with its STREAMINFO's total sample count zeroed ("unknown", as a streamed one)."""
    data = bytearray(flac)
    data[21] &= 0xF0  # STREAMINFO's 36-bit total starts in the low nibble of its 14th byte
    data[22:26] = bytes(4)
    return bytes(data)


@pytest.mark.parametrize(("head", "fmt"), [
    (b"RIFF\0\0\0\0WAVEfmt ", "wav"), (b"fLaC\0\0\0\x22", "flac"), (b"OggS\0\2", "ogg"),
    (b"\x1a\x45\xdf\xa3\x9f", "matroska"), (b"\0\0\0\x20ftypM4A ", "mov"), (b"caff\0\1", "caf"),
    (b"FORM\0\0\0\0AIFF", "aiff"), (b"#!AMR\n", "amr"), (b"ID3\4\0", "mp3"), (b"\xff\xfb\x90\x64", "mp3"),
    (b"\xff\xf1\x50\x80", "aac"), (b"ffconcat version 1.0\n", None), (b"#EXTM3U\n", None), (b"v=0\r\n", None),
    (b"\x89PNG\r\n\x1a\n", None), (b"[playlist]\n", None), (b"RIFF\0\0\0\0AVI ", None), (b"", None),
])
def test_the_format_is_chosen_from_the_files_first_bytes(head: bytes, fmt: str | None) -> None:
    from omnictl.serving.transcriptions.audiofile import sniff_format

    assert sniff_format(head) == fmt


def test_a_concat_list_naming_a_server_file_is_refused_without_opening_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 1: FFmpeg probed the upload, took this text for its concat demuxer's list and
    decoded the file it names (relative to the server's working directory)."""
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.wav").write_bytes(QUESTION)
    for text in (b"ffconcat version 1.0\nfile 'secret.wav'\n", b"ffconcat version 1.0\nfile 'missing.wav'\n"):
        with pytest.raises(InvalidRequest) as error:
            decode_audio_file(text, "file", 600)
        assert error.value.field == "file" and "not an audio file of a format taken here" in str(error.value)
        assert "No such file" not in str(error.value)  # the same answer whether the named file exists


def test_a_file_whose_header_claims_more_decoding_than_the_budget_is_refused_before_decoding() -> None:
    """Bug 3: 570 s of 384 kHz silence (63 KB of FLAC; within the duration and rate limits)
    was decoded (219 M samples, 2.6 GB) and resampled for minutes."""
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as error:
        decode_audio_file(flac_of(0.5, 384_000), "file", 1.0)  # the same claim, scaled to a 1 s limit
    assert not isinstance(error.value, PayloadTooLarge) and error.value.field == "file"
    assert str(error.value) == (
        "'file' is too much audio to decode: its header says 0.5 s at 384000 Hz in 1 channel(s); the limit is "
        "96,000 decoded samples (1 s of stereo at 48 kHz, all channels counted)"
    )
    many = flac_of(0.5, 48_000, channels=8)  # half a second, but 8 channels: 192,000 samples
    with pytest.raises(InvalidRequest, match="in 8 channel"):
        decode_audio_file(many, "file", 1.0)
    assert time.perf_counter() - started < 5  # ffmpeg made the files; the refusals are instant


def test_a_file_whose_header_does_not_say_stops_at_the_budget_while_decoding() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    with pytest.raises(InvalidRequest) as error:
        decode_audio_file(without_total(flac_of(0.5, 384_000)), "file", 1.0)
    assert str(error.value).startswith("'file' is too much audio to decode: it decodes to over ")


def test_audio_above_48_khz_comes_out_at_48_khz() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file
    from tests.test_inputs import tone, wav_bytes

    for data in (convert(wav_bytes(tone(0.5, rate=96_000), rate=96_000), "flac"),
                 wav_bytes(tone(0.5, rate=96_000), rate=96_000)):
        samples, rate = decode_audio_file(data, "file", 600)
        assert rate == 48_000 and samples.size == pytest.approx(24_000, abs=64)


def test_a_decode_given_up_on_stops() -> None:
    import threading

    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DecodeCancelled, match="the client is gone"):
        decode_audio_file(convert(QUESTION, "mp3"), "file", 600, cancel)


def test_a_damaged_file_says_so_without_ffmpegs_words() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    with pytest.raises(InvalidRequest) as error:
        decode_audio_file(b"fLaC" + bytes(40), "file", 600)
    assert str(error.value) == "'file' could not be read as flac audio (damaged, or not that format)"
