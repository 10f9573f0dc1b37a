"""Whisper base, assembled from the two packages once, hears the sample questions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from omnictl.models.voice_assistant.asr import SpeechRecognizer, whisper_base_dir
from benchmarks.eval.quality import word_errors
from benchmarks.eval.samples import sample_names, sample_question, sample_text

pytestmark = pytest.mark.slow  # the real Whisper


@pytest.fixture(scope="module")
def recognizer() -> SpeechRecognizer:
    return SpeechRecognizer()


def test_the_spoken_paris_question_is_heard(recognizer: SpeechRecognizer) -> None:
    samples, rate = sample_question("capital_of_france")
    assert "capital of france" in recognizer.transcribe(samples, rate).lower()


def test_audio_at_another_rate_is_resampled_first(recognizer: SpeechRecognizer) -> None:
    from omnictl.inputs import resample

    samples, rate = sample_question("spider_legs")
    heard = recognizer.transcribe(resample(samples, rate, 24_000), 24_000).lower()
    assert "spider" in heard and "legs" in heard


def test_the_model_folder_is_assembled_once_and_reused() -> None:
    folder = whisper_base_dir()
    model = folder / "model.bin"
    assert {p.name for p in folder.iterdir()} >= {"model.bin", "config.json", "tokenizer.json", "vocabulary.json"}
    before = model.stat().st_mtime_ns
    assert whisper_base_dir() == folder
    assert model.stat().st_mtime_ns == before  # not rewritten


def test_a_folder_left_half_written_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "whisper-base"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"truncated")  # no marker: an interrupted first run
    assert whisper_base_dir(tmp_path) == folder
    part_sizes = sum(p.stat().st_size for p in whisper_base_dir().glob("model.bin"))
    assert (folder / "model.bin").stat().st_size == part_sizes


@pytest.fixture(scope="module")
def fitted() -> SpeechRecognizer:
    return SpeechRecognizer(beam_size=1, window_padding_s=8.0)


@pytest.mark.parametrize("name", sample_names())
def test_a_window_fitted_to_the_clip_hears_each_sample(fitted: SpeechRecognizer, name: str) -> None:
    # The encoder sees the clip plus 8 s, not 30 s; with too little silence after the
    # speech Whisper repeats the question, which this would catch as extra words.
    samples, rate = sample_question(name)
    heard = fitted.transcribe(samples, rate)
    errors, words = word_errors(sample_text(name), heard)
    assert errors <= 1, f"{name}: heard {heard!r}"


def test_a_clip_too_long_for_the_fitted_window_is_still_heard(fitted: SpeechRecognizer) -> None:
    samples, rate = sample_question("capital_of_france")
    gap = np.zeros(int(23 * rate), dtype=np.float32)  # 2 s of speech + 23 s + 8 s of padding > 30 s
    assert "capital of france" in fitted.transcribe(np.concatenate([samples, gap]), rate).lower()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"window_padding_s": 30.0}, "window_padding_s: must be in [0, 30)"),
        ({"window_padding_s": -1.0}, "window_padding_s: must be in [0, 30)"),
        ({"window_padding_s": 8.0, "language": None}, "window_padding_s: needs a fixed language"),
        ({"window_padding_s": 8.0, "temperatures": [0.0, 0.4]}, "window_padding_s: needs a fixed language and a single temperature"),
        ({"cpu_threads": -1}, "cpu_threads: must be >= 0"),
    ],
)
def test_bad_settings_are_refused_by_name(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SpeechRecognizer(**arguments)  # type: ignore[arg-type]
