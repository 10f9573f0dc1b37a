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


# --- what a file costs, not only what it decodes to (issue 45) ------------------------------


def _ebml(ident: int, payload: bytes) -> bytes:
    """One EBML element: its ID, its size (in 8 bytes, which fit anything), its payload."""
    return ident.to_bytes((ident.bit_length() + 7) // 8, "big") + b"\x01" + len(payload).to_bytes(7, "big") + payload


def _ebml_uint(ident: int, value: int) -> bytes:
    return _ebml(ident, value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big"))


def laced_pcm_mkv(seconds: float, rate: int = 48_000, tracks: tuple[int, ...] = (1,)) -> bytes:
    """Matroska of 8-bit PCM silence, one mono track for each entry of ``tracks`` (its
    samples a packet), 256 packets laced (fixed-size lacing) in each block: about one byte
    of file a packet at one sample each. ``laced_pcm_mkv(40)`` is issue 45's file: 40 s in
    1.92 million packets, 2 MB."""
    import struct

    total = int(seconds * rate)
    audio = _ebml(0xE1, _ebml(0xB5, struct.pack(">d", float(rate))) + _ebml_uint(0x9F, 1) + _ebml_uint(0x6264, 8))
    entries = b"".join(
        _ebml(0xAE, _ebml_uint(0xD7, number) + _ebml_uint(0x73C5, number) + _ebml_uint(0x83, 2)
              + _ebml(0x86, b"A_PCM/INT/LIT") + audio)
        for number in range(1, len(tracks) + 1)
    )
    blocks = sorted(  # (start in ms, track, samples a packet, packets): the tracks interleaved in time
        (start * 1000 // rate, number, per_packet, min(256, -(-(total - start) // per_packet)))
        for number, per_packet in enumerate(tracks, 1)
        for start in range(0, total, 256 * per_packet)
    )
    clusters, body, base = [], [], 0
    for ms, number, per_packet, count in blocks:
        if ms - base > 30_000:  # a block's time is 16 bits of ms after its cluster's
            clusters.append(_ebml(0x1F43B675, _ebml_uint(0xE7, base) + b"".join(body)))
            body, base = [], ms
        head = bytes([0x80 | number]) + (ms - base).to_bytes(2, "big") + bytes([0x80 | 0x04, count - 1])  # fixed lacing
        body.append(_ebml(0xA3, head + b"\x80" * (count * per_packet)))
    clusters.append(_ebml(0x1F43B675, _ebml_uint(0xE7, base) + b"".join(body)))
    header = _ebml(0x1A45DFA3, _ebml_uint(0x4286, 1) + _ebml_uint(0x42F7, 1) + _ebml_uint(0x42F2, 4)
                   + _ebml_uint(0x42F3, 8) + _ebml(0x4282, b"matroska") + _ebml_uint(0x4287, 4)
                   + _ebml_uint(0x4285, 2))
    info = _ebml(0x1549A966, _ebml_uint(0x2AD7B1, 1_000_000) + _ebml(0x4489, struct.pack(">d", seconds * 1000)))
    return header + _ebml(0x18538067, info + _ebml(0x1654AE6B, entries) + b"".join(clusters))


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/self/status has no {key}")


def decode_cost(data: bytes, give_up_s: float = 20.0) -> tuple[str, float, int]:
    """What decoding ``data`` came to (its samples and rate, or the refusal), in how many
    seconds, and the process's peak memory growth meanwhile (bytes): the resident set's
    peak, reset to the resident set just before (Linux's clear_refs). A decode still going
    after ``give_up_s`` is given up on (the test fails rather than waits)."""
    import threading

    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    decode_audio_file(laced_pcm_mkv(0.1, tracks=(256,)), "file", 600)  # FFmpeg's first-use allocations
    cancel = threading.Event()
    timer = threading.Timer(give_up_s, cancel.set)
    timer.start()
    before = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    started = time.perf_counter()
    try:
        samples, rate = decode_audio_file(data, "file", 600, cancel)
        outcome = f"{samples.size} samples at {rate} Hz"
    except InvalidRequest as error:
        outcome = str(error)
    except DecodeCancelled:
        outcome = f"still decoding after {give_up_s:g} s"
    finally:
        timer.cancel()
    return outcome, time.perf_counter() - started, _status_bytes("VmHWM") - before


def test_a_2_mb_file_of_1_92_million_packets_is_refused_at_once_and_costs_no_memory() -> None:
    """Issue 45: 40 s of 8-bit PCM at 48 kHz in one-sample packets (2 MB) passed every
    limit and was decoded packet by packet, one numpy array each: the process grew by
    ~490 MB and the decode took 45-175 s. Now it is refused after its first ~1,000 packets,
    the process's peak memory growth meanwhile bounded here at 20 MB (it is ~0)."""
    data = laced_pcm_mkv(40)
    assert len(data) < 2_100_000
    outcome, took, growth = decode_cost(data)
    assert growth < 20 * 2**20, f"the process grew by {growth / 2**20:.0f} MB in {took:.1f} s ({outcome})"
    assert outcome == (
        "'file' has too many packets for its audio: 1,022 packets hold 0.021 s; the limit is 1,000 packets "
        "per second of audio (and 1,000 more), which no audio codec in use needs"
    )
    assert took < 1.0, took


def test_a_file_of_1_ms_packets_is_taken_and_one_of_0_8_ms_packets_is_not() -> None:
    """The limit's edge: 1,000 packets a second of audio is decoded (48 samples a packet at
    48 kHz); 1,200 (40 samples) is refused once the count outruns the audio."""
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    samples, rate = decode_audio_file(laced_pcm_mkv(8, tracks=(48,)), "file", 600)
    assert (samples.size, rate) == (8 * 48_000, 48_000)
    with pytest.raises(InvalidRequest, match=r"has too many packets for its audio: 5,996 packets hold 4\.996 s"):
        decode_audio_file(laced_pcm_mkv(8, tracks=(40,)), "file", 600)


def packets_a_second(data: bytes) -> float:
    """The audio stream's packets per second of its audio, by ffprobe."""
    from tests.serving.ffprobe import FFPROBE, probe

    assert FFPROBE is not None
    out = subprocess.run([FFPROBE, "-v", "error", "-select_streams", "a:0", "-count_packets", "-show_entries",
                          "stream=nb_read_packets", "-of", "csv=p=0", "-"], input=data, capture_output=True,
                         check=True, timeout=60)
    return int(out.stdout.decode().strip().strip(",")) / probe(data)[1]


@pytest.mark.parametrize(("suffix", "args", "expected"), [
    ("caf", ("-c:a", "adpcm_ima_qt", "-ar", "48000"), 750),  # Apple's ima4: 64 samples a packet
    ("ogg", ("-c:a", "libopus", "-frame_duration", "2.5"), 400),  # Opus's shortest frames
])
def test_the_codecs_with_the_most_packets_a_second_are_taken(suffix: str, args: tuple[str, ...],
                                                               expected: int) -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    data = convert(QUESTION, suffix, *args)
    assert packets_a_second(data) == pytest.approx(expected, rel=0.02)
    samples, rate = decode_audio_file(data, "file", 600)
    assert samples.size / rate == pytest.approx(seconds_of(QUESTION), abs=0.08)


def test_the_packets_of_a_stream_beside_the_audio_count() -> None:
    """A second track of one-sample packets is demuxed (and cost the loop) as much as if
    it were the audio: it counts, though only the first audio stream is decoded."""
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    samples, _ = decode_audio_file(laced_pcm_mkv(2, tracks=(1000, 1000)), "file", 600)
    assert samples.size == 2 * 48_000
    with pytest.raises(InvalidRequest, match="has too many packets for its audio"):
        decode_audio_file(laced_pcm_mkv(2, tracks=(1000, 1)), "file", 600)


@pytest.mark.slow
def test_the_costliest_file_taken_decodes_into_one_buffer() -> None:
    """At the limit (1 kHz, one sample a packet: 1,000 packets a second) 300 s of audio is
    300,000 packets: decoded, in one buffer, where a list of per-frame arrays grew the
    process by ~75 MB (~250 bytes a frame)."""
    outcome, took, growth = decode_cost(laced_pcm_mkv(300, rate=1000), give_up_s=60)
    assert growth < 16 * 2**20, f"the process grew by {growth / 2**20:.0f} MB in {took:.1f} s ({outcome})"
    assert outcome == "300000 samples at 1000 Hz"
