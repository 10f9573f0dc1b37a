"""Semantic end of turn (Smart Turn v3.2 over Silero VAD), the session's own detectors on a
packaged spoken question: a pause before the last word ends a silence-only turn, not a
semantic one; and eagerness changes how long the detector waits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.realtime_turn_detection import question, run, with_pause
from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector, SmartTurnModel, log_mel
from omnictl.serving.realtime.vad import SileroModel, TurnDetector, VadSettings

LEAD, TAIL = np.zeros(PCM16_RATE // 2, np.float32), np.zeros(PCM16_RATE * 5, np.float32)


@pytest.fixture(scope="module")
def models() -> tuple[SileroModel, SmartTurnModel]:
    return SileroModel(), SmartTurnModel()


def test_the_features_are_those_smart_turn_was_trained_on() -> None:
    """Against pipecat's own (vendored from transformers' WhisperFeatureExtractor)."""
    reference = pytest.importorskip("pipecat.audio.turn.smart_turn._whisper_features")
    audio = np.random.default_rng(0).standard_normal(16_000 * 8).astype(np.float32) * 0.1
    audio[:16_000] *= np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000).astype(np.float32)
    features = log_mel(audio)
    assert features.shape == (80, 800) and features.dtype == np.float32
    np.testing.assert_allclose(features, reference.compute_whisper_log_mel_features(audio), atol=1e-5)


def test_on_speech_the_library_features_give_the_model_the_reference_answers(models: Any) -> None:
    """faster-whisper's extractor (what log_mel uses) against pipecat's reference, on the
    packaged question whole (finished: p 0.99) and cut at 60 % (not: p 0.13)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    from omnictl.audio import resample
    from omnictl.serving.realtime import smart_turn

    reference = pytest.importorskip("pipecat.audio.turn.smart_turn._whisper_features")
    assert isinstance(smart_turn._extractor(), FeatureExtractor)  # the library's, not a filter bank of our own
    _silero, smart = models
    for name in ("capital_of_france",):
        speech = resample(question(name), PCM16_RATE, 16_000)
        for spoken in (speech, speech[: int(speech.size * 0.6)]):
            window = np.zeros(16_000 * 8, np.float32)
            window[window.size - spoken.size :] = spoken  # at the end, as SmartTurnModel.finished places it
            ours, theirs = log_mel(window), reference.compute_whisper_log_mel_features(window)
            np.testing.assert_allclose(ours, theirs, atol=1e-5)
            answers = [float(np.asarray(smart.session.run(None, {"input_features": f[None]})[0]).reshape(-1)[0])
                       for f in (ours, theirs)]
            assert answers[0] == pytest.approx(answers[1], abs=1e-4), (name, spoken.size, answers)


def test_a_pause_before_the_last_word_is_one_semantic_turn_and_two_silence_turns(models: Any) -> None:
    silero, smart = models
    paused = np.concatenate([LEAD, with_pause(question("spider_legs"), 900), TAIL])  # "... does a spider | have?"
    assert len(run(TurnDetector(VadSettings(silence_duration_ms=500)), silero, paused)[0]) == 2  # cut at the pause
    detector = SemanticTurnDetector(smart, "auto")
    ends, _ = run(detector, silero, paused)
    assert len(ends) == 1, (ends, detector.asked)
    assert detector.asked[0] < 0.5 <= detector.asked[-1]  # "not finished" at the pause, "finished" at the end


def test_eagerness_changes_the_wait(models: Any) -> None:
    silero, smart = models
    plain = np.concatenate([LEAD, question("capital_of_france"), TAIL])
    ends = {e: run(SemanticTurnDetector(smart, e), silero, plain)[0] for e in ("high", "low")}
    assert len(ends["high"]) == len(ends["low"]) == 1
    assert ends["low"][0] - ends["high"][0] >= 300  # asked after 150 ms of silence against 600 ms


def test_the_semantic_detector_says_pauses_and_resumes_before_its_one_stop(models: Any) -> None:
    """A preemptive answer starts at each pause and is dropped when speech resumes: at the
    mid-sentence pause the detector says SpeechPaused, then SpeechResumed when "have?" comes;
    at the end a pause at the very point where the turn then stops."""
    from omnictl.serving.realtime.vad import (
        VAD_RATE,
        SileroVad,
        SpeechPaused,
        SpeechResumed,
        SpeechStarted,
        SpeechStopped,
        to_vad_rate,
    )

    silero, smart = models
    paused = np.concatenate([LEAD, with_pause(question("spider_legs"), 900), TAIL])
    detector, vad, found = SemanticTurnDetector(smart, "auto"), SileroVad(silero, VAD_RATE), []
    for start in range(0, paused.size, PCM16_RATE // 10):
        chunk = to_vad_rate(paused[start : start + PCM16_RATE // 10], PCM16_RATE)
        found += detector.feed(vad.feed(chunk), chunk)
    assert [type(e) for e in found] == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped], found
    assert found[1].audio_end_ms < found[3].audio_end_ms == found[4].audio_end_ms
    quiet = SemanticTurnDetector(smart, "auto", preempt_ms=None)
    vad = SileroVad(silero, VAD_RATE)
    types = set()
    for start in range(0, paused.size, PCM16_RATE // 10):
        chunk = to_vad_rate(paused[start : start + PCM16_RATE // 10], PCM16_RATE)
        types |= {type(e) for e in quiet.feed(vad.feed(chunk), chunk)}
    assert types == {SpeechStarted, SpeechStopped}
