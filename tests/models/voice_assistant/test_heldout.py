"""The held-out set really is held out: other questions, other voices, enough of both."""

from __future__ import annotations

from pathlib import Path

from benchmarks.eval.heldout import HELDOUT_QUESTIONS, HELDOUT_VOICES
from benchmarks.eval.quality import QUESTIONS, VOICES, SpeechMaker, normalize


def test_at_least_thirty_questions_none_of_them_tuned_on_each_with_an_answer() -> None:
    assert len(HELDOUT_QUESTIONS) >= 30
    tuned = {normalize(q.text) for q in QUESTIONS}
    texts = [normalize(q.text) for q in HELDOUT_QUESTIONS]
    assert not tuned & set(texts)
    assert len(set(texts)) == len(texts)
    assert all(q.accepted for q in HELDOUT_QUESTIONS)


def test_several_espeak_voices_none_of_them_tuned_on_and_the_piper_voice() -> None:
    tuned = {(v.voice, v.speed, v.pitch) for v in VOICES if v.engine == "espeak-ng"}
    espeak = [v for v in HELDOUT_VOICES if v.engine == "espeak-ng"]
    assert len(espeak) >= 3 and not tuned & {(v.voice, v.speed, v.pitch) for v in espeak}
    assert len({v.speed for v in espeak}) >= 3  # several speeds, not one
    assert any(v.engine == "piper" for v in HELDOUT_VOICES)


def test_every_espeak_voice_speaks(tmp_path: Path) -> None:
    speech = SpeechMaker(tmp_path)
    for voice in HELDOUT_VOICES:
        if voice.engine == "espeak-ng":
            clip = speech.speak("What is the capital of Portugal?", voice)
            assert clip.size > 16_000 * 1.0 and float(abs(clip).max()) > 0.05, voice.name
