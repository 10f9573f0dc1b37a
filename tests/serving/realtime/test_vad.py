"""Server VAD: the Silero model faster-whisper ships, and turn detection on real speech."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.eval.samples import sample_question
from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime.vad import (
    PREEMPT_MS,
    SileroModel,
    SileroVad,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    VadSettings,
)


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
    assert [type(e) for e in found] == [SpeechStarted, SpeechPaused, SpeechStopped]  # it pauses, then stops there
    start, stop = found[0].audio_start_ms, found[2].audio_end_ms  # type: ignore[attr-defined]
    assert found[1].audio_end_ms == stop  # type: ignore[attr-defined]
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
    # the pause is a pause (the answer would start there), then speech resumes
    assert [type(e) for e in long_wait] == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped]
    short_wait = detect(model, audio, rate, VadSettings(silence_duration_ms=200), piece=512)
    assert [type(e) for e in short_wait] == [SpeechStarted, SpeechStopped] * 2


def test_a_pause_mid_question_is_said_then_taken_back_and_the_stop_follows_the_last(model: SileroModel) -> None:
    """What a preemptive answer rests on: a pause of preempt_ms says SpeechPaused where the
    silence began, speech coming back says SpeechResumed, and the turn's end is a pause at the
    very point where it then stops; a pause shorter than preempt_ms says nothing."""
    from benchmarks.realtime_turn_detection import question, with_pause

    paused = np.concatenate([np.zeros(PCM16_RATE // 2, np.float32), with_pause(question("spider_legs"), 400),
                             np.zeros(PCM16_RATE, np.float32)])
    found = detect(model, paused, PCM16_RATE, VadSettings(silence_duration_ms=800), piece=2400)
    assert [type(e) for e in found] == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped]
    first, last, stop = found[1], found[3], found[4]
    assert first.audio_end_ms < last.audio_end_ms == stop.audio_end_ms  # type: ignore[attr-defined]
    # later than preempt_ms in the silence, it is not said: the turn ends without a pause
    assert [type(e) for e in detect(model, paused, PCM16_RATE, VadSettings(silence_duration_ms=800, preempt_ms=None),
                                    piece=2400)] == [SpeechStarted, SpeechStopped]
    assert PREEMPT_MS < VadSettings().silence_duration_ms  # the default pause comes before the default stop


def test_a_pause_is_counted_in_frames_of_silence() -> None:
    """Probabilities straight in: the pause comes after exactly preempt_ms of quiet frames."""
    turns = TurnDetector(VadSettings(silence_duration_ms=500, preempt_ms=200))
    frame_ms = turns.frame_ms
    pause_frames = round(200 / frame_ms)
    events = turns.feed([0.9] * 10 + [0.1] * (pause_frames - 1))
    assert [type(e) for e in events] == [SpeechStarted]
    events = turns.feed([0.1])
    assert events == [SpeechPaused(int(10 * frame_ms))]
    assert turns.feed([0.1]) == [] and turns.feed([0.9]) == [SpeechResumed()]
    assert turns.feed([0.1] * round(500 / frame_ms)) == [SpeechPaused(int(18 * frame_ms)), SpeechStopped(int(18 * frame_ms))]
