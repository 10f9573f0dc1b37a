"""The compressed speech formats (mp3, opus, aac, flac) and the streamed WAV, encoded chunk by
chunk from one real Piper waveform and judged by ffprobe and Whisper."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from omnictl.models.voice_assistant.tts import PiperSpeaker
from omnictl.serving.speech.encode import CODECS, AudioStreamEncoder, encode_whole
from omnictl.serving.transcriptions.audiofile import decode_audio_file
from tests.serving.ffprobe import CODEC_NAMES, needs_ffmpeg, probe

pytestmark = needs_ffmpeg
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "The sky is blue today."]


@pytest.fixture(scope="module")
def spoken() -> tuple[list[np.ndarray], int]:
    """Two sentences as Piper speaks them (the TTS stage streams one chunk per sentence)."""
    speaker = PiperSpeaker()
    return [speaker.synthesize(sentence) for sentence in SENTENCES], speaker.sample_rate


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_each_format_streams_a_file_of_its_codec_and_length_that_whisper_understands(
        fmt: str, spoken: tuple[list[np.ndarray], int], whisper: Any) -> None:
    chunks, rate = spoken
    encoder = AudioStreamEncoder(fmt)
    pieces = [encoder.encode(chunk, rate) for chunk in chunks]
    pieces.append(encoder.finish())
    assert pieces[0], "the first sentence's bytes must go out before the second is encoded"
    data = b"".join(pieces)
    codec, seconds = probe(data)
    expected = sum(chunk.size for chunk in chunks) / rate
    assert codec == CODEC_NAMES[fmt]
    assert seconds == pytest.approx(expected, rel=0.05), (fmt, seconds, expected)
    assert encoder.seconds == pytest.approx(expected)
    samples, decoded_rate = decode_audio_file(data, "file", 60)
    heard = whisper.transcribe(samples, decoded_rate).lower()
    assert "fox" in heard and "sky" in heard, (fmt, heard)


@pytest.mark.parametrize("fmt", sorted(CODECS))
def test_a_whole_file_is_valid_and_an_empty_stream_ends(fmt: str, spoken: tuple[list[np.ndarray], int]) -> None:
    chunks, rate = spoken
    codec, seconds = probe(encode_whole(chunks[1], rate, fmt))
    assert codec == CODEC_NAMES[fmt] and seconds == pytest.approx(chunks[1].size / rate, rel=0.1)
    # Unspeakable input ("**") streams no audio: ending such a stream must not fail (a file
    # of 0 samples for WAV and FLAC, no bytes for the frame formats: tests/serving/speech/test_audio.py).
    assert isinstance(AudioStreamEncoder(fmt).finish(), bytes)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="ogg"):
        AudioStreamEncoder("ogg")
