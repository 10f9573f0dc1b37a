"""Whisper's decoding settings chosen on voices they were not tuned on.

Speaks the held-out questions of :mod:`benchmarks.eval.heldout` (32, each
with known answers) in five ``espeak-ng`` voices none of the earlier tuning used
(accents, speeds and pitches) and in the Piper voice; the audio is made at run time.
Every clip is transcribed by every candidate setting in turn (side by side, so a load
that comes and goes hits them all alike), and each transcript is answered by the
embedded thinker (SmolLM2-135M-Instruct with the topology's own ``thinker`` settings,
greedy, in this process; answers are cached per distinct transcript).

Prints, per setting: word error rate, answer accuracy (an accepted answer in the first
sentence), and ASR seconds per clip (median and 90th percentile); the typed questions'
accuracy is the ceiling no ASR can beat. The winner is the most accurate setting,
then the lowest WER, then the fastest; the script says whether the embedded topology's
``asr`` settings are that winner.

Run: ``python benchmarks/asr_heldout.py [--questions 32] [--voices 0,1,2,3,4,5] [--settings a,b] [--json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.data import data_path
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from benchmarks.eval.heldout import HELDOUT_QUESTIONS, HELDOUT_VOICES
from omnictl.models.voice_assistant.llm import set_threads
from benchmarks.eval.quality import Question, SpeechMaker, is_correct, normalize, word_errors

TOPOLOGY = data_path("voice-assistant.yaml")

# name -> SpeechRecognizer arguments (language "en", no temperature fallback, no timestamps in all)
SETTINGS: dict[str, dict[str, Any]] = {
    "beam 5 · 30 s window": {"beam_size": 5},
    "greedy · 30 s window": {"beam_size": 1},
    "beam 5 · clip + 5 s": {"beam_size": 5, "window_padding_s": 5.0},
    "beam 5 · clip + 8 s": {"beam_size": 5, "window_padding_s": 8.0},
    "beam 5 · clip + 12 s": {"beam_size": 5, "window_padding_s": 12.0},
    "greedy · clip + 8 s": {"beam_size": 1, "window_padding_s": 8.0},
    "beam 5 · clip + 8 s · prompt": {
        "beam_size": 5, "window_padding_s": 8.0, "initial_prompt": "A short question asked out loud to a voice assistant."},
}
_COMMON: dict[str, Any] = {"language": "en", "temperatures": 0.0, "without_timestamps": True, "vad_filter": False}


@dataclass
class Row:
    setting: str
    clips: int
    wer: float
    correct: int
    asr_p50_s: float
    asr_p90_s: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.clips if self.clips else 0.0


class Answerer:
    """The topology's thinker, in this process: one greedy answer per distinct question text."""

    def __init__(self, thinker_args: dict[str, Any]) -> None:
        from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner
        from omnictl.models.voice_assistant.llm import smollm2_checkpoint

        self.max_tokens = int(thinker_args.get("max_tokens", 32))
        shaping = {key: thinker_args[key] for key in ("system_prompt", "repetition_penalty", "no_repeat_ngram", "max_sentences") if key in thinker_args}
        self.runner = SpokenAnswerRunner.from_pretrained(smollm2_checkpoint(), **shaping)
        self._stop = self.runner.stop_token_ids()
        self._cache: dict[str, str] = {}

    def answer(self, question: str) -> str:
        key = normalize(question)
        if key not in self._cache:
            self._cache[key] = self._generate(question)
        return self._cache[key]

    def _generate(self, question: str) -> str:
        output = self.runner.prefill("q", {"messages": [{"role": "user", "content": question}]})
        tokens: list[int] = []
        try:
            for _ in range(self.max_tokens):
                token = int(output.logits.argmax())
                if token in self._stop:
                    break
                tokens.append(token)
                output = self.runner.decode(["q"], [token])[0]
        finally:
            self.runner.release("q")
        return self.runner.detokenize(tokens).strip()


def thinker_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """The embedded topology's thinker and asr factory_args."""
    spec = yaml.safe_load(TOPOLOGY.read_text())
    stages = {stage["name"]: stage for stage in spec["stages"]}
    return dict(stages["thinker"].get("factory_args") or {}), dict(stages["asr"].get("factory_args") or {})


def chosen(rows: list[Row]) -> Row:
    return min(rows, key=lambda r: (-r.correct, r.wer, r.asr_p50_s))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=len(HELDOUT_QUESTIONS), help="the first N held-out questions")
    parser.add_argument("--voices", default=",".join(str(i) for i in range(len(HELDOUT_VOICES))), help="indices into HELDOUT_VOICES")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated names, from: {', '.join(SETTINGS)}")
    parser.add_argument("--audio-dir", type=Path, help="cache the spoken clips here (default: a temporary folder)")
    parser.add_argument("--misheard", action="store_true", help="list every transcript with word errors")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the answers (0: every core)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()

    console = Console(stderr=True)
    questions: list[Question] = list(HELDOUT_QUESTIONS[: args.questions])
    voices = [HELDOUT_VOICES[int(i)] for i in args.voices.split(",") if i.strip()]
    names = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = [name for name in names if name not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; known: {', '.join(SETTINGS)}")
    # One torch thread for the answers: on a shared machine two OpenMP threads per process
    # made each token several times slower (README, "Time to first audio").
    set_threads(args.threads)
    thinker_args, topology_asr = thinker_settings()
    recognizers = {name: SpeechRecognizer(**(_COMMON | SETTINGS[name])) for name in names}
    answerer = Answerer(thinker_args)

    with tempfile.TemporaryDirectory(prefix="omnictl-asr-heldout-") as tmp:
        speech = SpeechMaker(args.audio_dir or Path(tmp))
        clips = [(voice, question, speech.speak(question.text, voice)) for voice in voices for question in questions]
        console.log(f"{len(clips)} clips: {len(questions)} questions x {len(voices)} voices")
        for recognizer in recognizers.values():  # first calls allocate; keep them out of the timings
            recognizer.transcribe(clips[0][2])
        heard: dict[str, list[tuple[str, str, str, float]]] = {name: [] for name in names}
        for index, (voice, question, clip) in enumerate(clips):
            for name, recognizer in recognizers.items():
                started = time.perf_counter()
                text = recognizer.transcribe(clip)
                heard[name].append((voice.name, question.text, text, time.perf_counter() - started))
            if (index + 1) % len(questions) == 0:
                console.log(f"transcribed: {voice.name}")

    by_text = {q.text: q for q in questions}
    typed_right = sum(is_correct(answerer.answer(q.text), q) for q in questions)
    rows: list[Row] = []
    per_voice: dict[str, dict[str, float]] = {}
    for name in names:
        edits = words = correct = 0
        voice_errors: dict[str, list[int]] = {}
        for voice_name, question_text, text, _ in heard[name]:
            e, n = word_errors(question_text, text)
            edits, words = edits + e, words + n
            counts = voice_errors.setdefault(voice_name, [0, 0])
            counts[0], counts[1] = counts[0] + e, counts[1] + n
            correct += is_correct(answerer.answer(text), by_text[question_text])
        times = sorted(seconds for *_, seconds in heard[name])
        rows.append(Row(name, len(times), edits / max(1, words), correct, statistics.median(times), times[int(0.9 * (len(times) - 1))]))
        per_voice[name] = {voice: e / max(1, n) for voice, (e, n) in voice_errors.items()}
        console.log(f"answered: {name}")

    table = Table(title=f"Whisper base on held-out voices: {len(questions)} questions x {len(voices)} voices")
    for column in ("setting", "WER", "answer accuracy", "ASR s/clip p50", "p90"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for row in rows:
        table.add_row(row.setting, f"{row.wer:.1%}", f"{row.correct}/{row.clips} ({row.accuracy:.0%})", f"{row.asr_p50_s:.2f}", f"{row.asr_p90_s:.2f}")
    table.add_row("typed (no ASR: the ceiling)", "—", f"{typed_right}/{len(questions)} ({typed_right / len(questions):.0%})", "—", "—")
    out = Console()
    out.print(table)
    voice_table = Table(title="WER per voice")
    voice_table.add_column("setting")
    for voice in voices:
        voice_table.add_column(voice.name, justify="right")
    for name in names:
        voice_table.add_row(name, *(f"{per_voice[name].get(voice.name, 0.0):.1%}" for voice in voices))
    out.print(voice_table)
    best = chosen(rows)
    embedded: dict[str, Any] = {key: topology_asr[key] for key in ("beam_size", "window_padding_s", "initial_prompt") if key in topology_asr}
    best_settings: dict[str, Any] = {"initial_prompt": None, "window_padding_s": None} | SETTINGS[best.setting]
    best_args = {key: best_settings.get(key) for key in ("beam_size", "window_padding_s", "initial_prompt")}
    is_default = all(embedded.get(key) == value for key, value in best_args.items())
    out.print(f"chosen by accuracy, then WER, then time: {best.setting!r} ({best.accuracy:.0%}, WER {best.wer:.1%}, {best.asr_p50_s:.2f} s/clip)")
    out.print(f"embedded default asr settings {embedded}: {'the chosen setting' if is_default else 'NOT the chosen setting'}")
    if args.misheard:
        for name in names:
            for voice_name, question_text, text, _ in heard[name]:
                if word_errors(question_text, text)[0]:
                    out.print(f"  [{name} | {voice_name}] {question_text!r} heard as {text!r}")
    if args.json:
        json.dump({"rows": [asdict(row) | {"accuracy": row.accuracy} for row in rows], "per_voice_wer": per_voice,
                   "typed_correct": typed_right, "chosen": best.setting}, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
