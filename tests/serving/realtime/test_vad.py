"""Server VAD: the Silero model faster-whisper ships, and turn detection on real speech."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.eval.samples import sample_question
from omnictl.serving.realtime.vad import SileroModel, SileroVad, SpeechStarted, SpeechStopped, TurnDetector, VadSettings


@pytest.fixture(scope="module")
def model() -> SileroModel:
    return SileroModel()


def detect(model: SileroModel, audio: np.ndarray, rate: int, settings: VadSettings, piece: int) -> list[object]:
    vad, turns = SileroVad(model, rate), TurnDetector(settings)
    found: list[object] = []
    for start in range(0, audio.size, piece):  # as a microphone delivers it
        found += turns.feed(vad.feed(audio[start : start + piece]))
    return found


def test_speech_between_silences_is_one_turn_with_its_times(model: SileroModel) -> None:
    speech, rate = sample_question("spider_legs")  # 0.2 s of silence either side of the question
    pad = np.zeros(rate, dtype=np.float32)
    audio = np.concatenate([pad, speech, pad])
    found = detect(model, audio, rate, VadSettings(silence_duration_ms=500), piece=1600)
    assert [type(e) for e in found] == [SpeechStarted, SpeechStopped]
    start, stop = found[0].audio_start_ms, found[1].audio_end_ms  # type: ignore[attr-defined]
    assert 1100 <= start <= 1400  # the voice begins ~1.2 s in
    assert abs(stop - (1000 + speech.size * 1000 / rate - 200)) < 250  # and ends ~0.2 s before the sample does


def test_silence_and_noise_are_not_speech(model: SileroModel) -> None:
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(24_000, np.float32), (0.01 * rng.standard_normal(48_000)).astype(np.float32)])
    assert detect(model, audio, 24_000, VadSettings(), piece=2400) == []


def test_a_short_pause_does_not_end_the_turn(model: SileroModel) -> None:
    speech, rate = sample_question("sky_colour")
    pause = np.zeros(int(0.1 * rate), np.float32)  # with the samples' own padding: ~0.5 s without voice
    audio = np.concatenate([speech, pause, speech, np.zeros(rate, np.float32)])
    long_wait = detect(model, audio, rate, VadSettings(silence_duration_ms=1000), piece=512)
    assert [type(e) for e in long_wait] == [SpeechStarted, SpeechStopped]
    short_wait = detect(model, audio, rate, VadSettings(silence_duration_ms=200), piece=512)
    assert [type(e) for e in short_wait] == [SpeechStarted, SpeechStopped] * 2
