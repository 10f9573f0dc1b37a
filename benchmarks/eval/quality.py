"""Answer quality of the voice assistant: questions, spoken renditions, scoring.

Used by ``benchmarks/answer_quality.py`` (the full table) and by the short CI form in
``tests/models/voice_assistant/test_answer_quality.py``. Audio is made here, never
committed: ``espeak-ng`` (several voices, speeds and pitches) and the Piper voice.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnictl.inputs import read_wav, resample
from benchmarks.eval.samples import wav_bytes

SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class Question:
    text: str
    accepted: tuple[str, ...]  # any of these, as whole words, in the answer's first sentence


def _q(text: str, *accepted: str) -> Question:
    return Question(text, accepted)


# Short factual questions a new user would try first; none of them is in the ASR's initial prompt.
QUESTIONS: tuple[Question, ...] = (
    _q("What is the capital of France?", "Paris"),
    _q("How many legs does a spider have?", "eight", "8"),
    _q("What is the largest planet in the solar system?", "Jupiter"),
    _q("How many days are in a week?", "seven", "7"),
    _q("What do bees make?", "honey"),
    _q("What is the opposite of hot?", "cold"),
    _q("What colour is the sky on a clear day?", "blue"),
    _q("What is the capital of Japan?", "Tokyo"),
    _q("How many hours are in a day?", "twenty-four", "twenty four", "24"),
    _q("What is frozen water called?", "ice"),
    _q("What is the capital of Italy?", "Rome"),
    _q("How many months are in a year?", "twelve", "12"),
    _q("What planet do we live on?", "Earth"),
    _q("What is the opposite of up?", "down"),
    _q("What colour is grass?", "green"),
    _q("What animal says moo?", "cow", "cows"),
    _q("What is the capital of Germany?", "Berlin"),
    _q("How many sides does a triangle have?", "three", "3"),
    _q("What is the closest star to the Earth?", "Sun"),
    _q("What do cows drink?", "water"),
    _q("What is the capital of Spain?", "Madrid"),
    _q("How many minutes are in an hour?", "sixty", "60"),
    _q("What gas do humans breathe in to live?", "oxygen"),
    _q("What is the largest ocean on Earth?", "Pacific"),
    _q("What is two plus two?", "four", "4"),
    _q("Which animal is known as the king of the jungle?", "lion", "lions"),
    _q("What is the capital of England?", "London"),
    _q("What colour is a banana?", "yellow"),
    _q("How many wheels does a bicycle have?", "two", "2"),
    _q("What is the opposite of day?", "night"),
    _q("Which season comes after winter?", "spring"),
    _q("What is the capital of Canada?", "Ottawa"),
    _q("What is the boiling point of water in degrees Celsius?", "one hundred", "100"),
    _q("Who wrote Romeo and Juliet?", "Shakespeare", "William Shakespeare"),
    _q("What is the largest mammal?", "blue whale", "whale"),
    _q("What is the chemical symbol for gold?", "Au"),
    _q("How many continents are there?", "seven", "7"),
    _q("What is the fastest land animal?", "cheetah", "cheetahs"),
    _q("What is the capital of Russia?", "Moscow"),
    _q("What do you call a baby dog?", "puppy", "pup", "puppies"),
    _q("What is the opposite of big?", "small", "little"),
    _q("How many legs does a dog have?", "four", "4"),
)


@dataclass(frozen=True)
class Voice:
    """One way to say the questions: an espeak-ng voice at a speed and pitch, or Piper."""

    name: str
    engine: str  # "espeak-ng" or "piper"
    voice: str = ""
    speed: int = 175  # words per minute (espeak-ng)
    pitch: int = 50  # 0-99 (espeak-ng)


VOICES: tuple[Voice, ...] = (
    Voice("espeak en-us 175wpm p50", "espeak-ng", "en-us", 175, 50),
    Voice("espeak en-gb 150wpm p35", "espeak-ng", "en-gb", 150, 35),
    Voice("espeak en-us+f3 200wpm p70", "espeak-ng", "en-us+f3", 200, 70),
    Voice("piper joe", "piper"),
)


class SpeechMaker:
    """Speaks text in a :class:`Voice`, caching each clip as a 16 kHz WAV under ``cache``."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self._piper: Any = None  # PiperSpeaker, loaded on first use

    def speak(self, text: str, voice: Voice) -> np.ndarray:
        """float32 mono at 16 kHz, with 0.2 s of silence either side as a microphone would record."""
        path = self.cache / _slug(voice.name) / f"{_slug(text)}.wav"
        if path.is_file():
            return read_wav(path.read_bytes(), field=str(path))[0]
        if voice.engine == "espeak-ng":
            samples, rate = self._espeak(text, voice)
        elif voice.engine == "piper":
            samples, rate = self._piper_speak(text)
        else:
            raise ValueError(f"voice {voice.name!r}: unknown engine {voice.engine!r} (espeak-ng or piper)")
        pad = np.zeros(SAMPLE_RATE // 5, dtype=np.float32)
        clip = np.concatenate([pad, resample(samples, rate, SAMPLE_RATE), pad]).astype(np.float32)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(wav_bytes(clip, SAMPLE_RATE))
        return clip

    def _espeak(self, text: str, voice: Voice) -> tuple[np.ndarray, int]:
        binary = shutil.which("espeak-ng")
        if binary is None:
            raise FileNotFoundError(
                "espeak-ng is not installed (apt-get install espeak-ng); it speaks the test questions"
            )
        command = [binary, "--stdout", "-v", voice.voice, "-s", str(voice.speed), "-p", str(voice.pitch), text]
        done = subprocess.run(command, capture_output=True, check=True, timeout=60)
        return read_wav(done.stdout, field=f"espeak-ng {voice.name}")

    def _piper_speak(self, text: str) -> tuple[np.ndarray, int]:
        from omnictl.models.voice_assistant.tts import PiperSpeaker

        if self._piper is None:
            self._piper = PiperSpeaker()
        return self._piper.synthesize(text), self._piper.sample_rate


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:80]


_SENTENCE_END = re.compile(r"(?<=[^\W\d_])[.!?](?:\s|$)|[!?](?:\s|$)|\n")


def first_sentence(answer: str) -> str:
    match = _SENTENCE_END.search(answer.strip())
    return answer.strip()[: match.end()].strip() if match else answer.strip()


# British and American spellings are the same words to a listener (Whisper writes American).
_SPELLINGS = {"colour": "color", "favourite": "favorite", "centre": "center", "metre": "meter"}


def normalize(text: str) -> str:
    words = re.sub(r"[^a-z0-9]+", " ", text.lower()).split()
    return " ".join(_SPELLINGS.get(word, word) for word in words)


def is_correct(answer: str, question: Question) -> bool:
    """An accepted answer occurs, as whole words, in the answer's first sentence (so a
    right word buried after a wrong claim, or a rambling second sentence, does not count)."""
    head = f" {normalize(first_sentence(answer))} "
    return any(f" {normalize(accepted)} " in head for accepted in question.accepted)


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) between normalized texts: WER = sum(edits) / sum(words)."""
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        current = [i]
        for j, heard in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != heard)))
        previous = current
    return previous[-1], len(ref)


def spoken_request(clip: np.ndarray) -> dict[str, Any]:
    """Pipeline ``inputs`` asking ``clip`` (16 kHz) out loud, as a base64 WAV part."""
    data = base64.b64encode(wav_bytes(clip, SAMPLE_RATE)).decode("ascii")
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    return {"messages": [{"role": "user", "content": [part]}], "sampling": {}}


def typed_request(question: Question) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question.text}], "sampling": {}}


async def ask(pipe: Any, inputs: dict[str, Any]) -> tuple[str, float]:
    """Submit ``inputs`` to a running voice-assistant pipeline: (text answer, seconds to first audio)."""
    started = time.perf_counter()
    request = await pipe.submit(inputs)
    first_audio = float("nan")
    async for event in request.events():
        if event.stage == "tts" and event.kind == "stream" and first_audio != first_audio:
            first_audio = time.perf_counter() - started
    result = await request.result()
    return str(result["decode"].text), first_audio
