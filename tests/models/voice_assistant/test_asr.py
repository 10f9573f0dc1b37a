"""Whisper base, assembled from the two packages once, hears the sample questions."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.models.voice_assistant.asr import SpeechRecognizer, whisper_base_dir
from omnictl.models.voice_assistant.samples import sample_question


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
