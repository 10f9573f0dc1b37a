"""G.711 at the edge: the numpy codecs against the ITU-T reference tables (Python's own
``audioop``, where this Python still ships it), and the format checks naming the field."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import CODECS, alaw_decode, alaw_encode, codec_for, ulaw_decode, ulaw_encode
from omnictl.serving.realtime.turns import Segment, Turn

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # removed in Python 3.13

EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)
EVERY_CODE = np.arange(256, dtype=np.uint8)


def test_mu_law_and_a_law_match_the_reference_for_every_value() -> None:
    pcm = EVERY_SAMPLE.astype("<i2").tobytes()
    assert bytes(ulaw_encode(EVERY_SAMPLE)) == audioop.lin2ulaw(pcm, 2)
    assert bytes(alaw_encode(EVERY_SAMPLE)) == audioop.lin2alaw(pcm, 2)
    assert ulaw_decode(EVERY_CODE).astype("<i2").tobytes() == audioop.ulaw2lin(bytes(EVERY_CODE), 2)
    assert alaw_decode(EVERY_CODE).astype("<i2").tobytes() == audioop.alaw2lin(bytes(EVERY_CODE), 2)


@pytest.mark.parametrize("kind", ["audio/pcmu", "audio/pcma"])
def test_a_tone_survives_8_khz_g711_both_ways(kind: str) -> None:
    t = np.arange(24_000) / 24_000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    codec = CODECS[kind]
    wire = codec.from_pcm16(tone.tobytes())
    assert len(wire) == 8_000  # one byte a sample at 8 kHz
    back = np.frombuffer(codec.to_pcm16(wire), "<i2").astype(np.float64)
    assert back.size == 24_000
    error = np.sqrt(np.mean((back[100:-100] - tone[100:-100]) ** 2)) / np.sqrt(np.mean(tone.astype(np.float64) ** 2))
    assert error < 0.1, error


def test_a_format_is_refused_by_the_field_at_fault() -> None:
    with pytest.raises(ev.EventError) as bad:
        codec_for(ev.AudioFormat(type="audio/gsm"), "session.audio.input.format", "e1")
    assert (bad.value.param, bad.value.code, bad.value.event_id) == ("session.audio.input.format.type", "unsupported_audio_format", "e1")
    with pytest.raises(ev.EventError) as bad:
        codec_for(ev.AudioFormat(type="audio/pcm", rate=16_000), "session.audio.output.format", None)
    assert bad.value.param == "session.audio.output.format.rate" and "24000" in bad.value.message
    assert codec_for(ev.AudioFormat(type="audio/pcmu", rate=8_000), "f", None).rate == 8_000


def test_truncate_keeps_the_words_whose_audio_was_played() -> None:
    turn = Turn(id="i", role="assistant", text="Once upon a time. There was a dragon.", spoken=True,
                segments=[Segment(0, 1000, "Once upon a time."), Segment(1000, 2000, "There was a dragon.")])
    turn.truncate(2000)
    assert turn.text == "Once upon a time. There was a dragon."
    turn.truncate(1500)  # half of the second piece's characters: "There was"
    assert turn.text == "Once upon a time. There was"
    turn.truncate(100)
    assert turn.text == "" and turn.truncated_ms == 100
