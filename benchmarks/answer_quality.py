"""Does the embedded voice assistant answer right? Typed and spoken, through the real pipeline.

Asks the short factual questions of :mod:`benchmarks.eval.quality` (each
with accepted answers) of ``omnictl/data/voice-assistant.yaml`` through
``omnictl.Pipeline``: typed, and spoken in several ``espeak-ng`` voices, speeds and
pitches plus the Piper voice (audio made by this script and cached under a temporary
folder for the run). One request at a time, so the timings are not queueing.

Prints, per voice and overall: answer accuracy, ASR word error rate (the same Whisper
settings as the topology's ``asr`` stage, run on the clip in this process), mean answer
length in words, median time to first audio. ``--json`` prints the same as JSON.

Settings are tried without editing the topology: ``--set asr.beam_size=5`` (a stage's
``factory_args``, value parsed as YAML). ``--asr-only`` measures just the word error rate
(no LLM, no pipeline) — the cheap way to sweep Whisper's decoding settings.

Run: ``python benchmarks/answer_quality.py [--questions 40] [--voices 0,1,4] [--set thinker.max_tokens=48] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.data import data_path
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from benchmarks.eval.quality import (
    QUESTIONS,
    VOICES,
    Question,
    SpeechMaker,
    Voice,
    ask,
    is_correct,
    spoken_request,
    typed_request,
    word_errors,
)
from omnictl.pipeline import Pipeline

TOPOLOGY = data_path("voice-assistant.yaml")
TYPED = "typed"


@dataclass
class Answer:
    question: str
    mode: str  # "typed" or a voice name
    answer: str
    correct: bool
    first_audio_s: float
    heard: str | None = None  # what the standalone ASR heard (spoken only)


@dataclass
class Row:
    mode: str
    asked: int
    correct: int
    wer: float | None
    mean_words: float
    first_audio_p50_s: float
    asr_s_mean: float | None = None
    misses: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.asked if self.asked else 0.0


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``stage.key=value`` (value as YAML) -> {stage: {key: value}}."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, raw = item.partition("=")
        stage, dot, key = target.partition(".")
        if not sep or not dot or not stage or not key:
            raise SystemExit(f"--set {item!r}: expected STAGE.KEY=VALUE, e.g. asr.beam_size=5")
        overrides.setdefault(stage, {})[key] = yaml.safe_load(raw)
    return overrides


def topology_with(overrides: dict[str, dict[str, Any]], out_dir: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A copy of the embedded topology with ``factory_args`` overridden; also every stage's args."""
    spec = yaml.safe_load(TOPOLOGY.read_text())
    stages = {stage["name"]: stage for stage in spec["stages"]}
    for name, args in overrides.items():
        if name not in stages:
            raise SystemExit(f"--set {name}.…: no stage {name!r} in {TOPOLOGY} (stages: {', '.join(stages)})")
        stages[name].setdefault("factory_args", {}).update(args)
    path = out_dir / "voice-assistant.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, {name: dict(stage.get("factory_args") or {}) for name, stage in stages.items()}


def transcribe_all(
    questions: list[Question], voices: list[Voice], speech: SpeechMaker, asr_args: dict[str, Any], console: Console
) -> dict[tuple[str, str], tuple[str, float]]:
    """(voice, question) -> (what Whisper heard, seconds), with the topology's ASR settings."""
    recognizer = SpeechRecognizer(**asr_args)
    heard: dict[tuple[str, str], tuple[str, float]] = {}
    for voice in voices:
        for question in questions:
            clip = speech.speak(question.text, voice)
            started = time.perf_counter()
            text = recognizer.transcribe(clip)
            heard[voice.name, question.text] = (text, time.perf_counter() - started)
        console.log(f"ASR done: {voice.name}")
    return heard


def summarize(mode: str, answers: list[Answer], heard: dict[tuple[str, str], tuple[str, float]] | None) -> Row:
    wer = asr_mean = None
    if heard is not None and mode != TYPED:
        pairs = [word_errors(question.text, heard[mode, question.text][0]) for question in QUESTIONS if (mode, question.text) in heard]
        wer = sum(e for e, _ in pairs) / max(1, sum(n for _, n in pairs))
        asr_mean = statistics.mean(seconds for (voice, _), (_, seconds) in heard.items() if voice == mode)
    times = [a.first_audio_s for a in answers if a.first_audio_s == a.first_audio_s]
    return Row(
        mode=mode,
        asked=len(answers),
        correct=sum(a.correct for a in answers),
        wer=wer,
        mean_words=statistics.mean(len(a.answer.split()) for a in answers) if answers else 0.0,
        first_audio_p50_s=statistics.median(times) if times else float("nan"),
        asr_s_mean=asr_mean,
        misses=[f"{a.question} -> {a.answer!r}" + (f" (heard {a.heard!r})" if a.heard is not None else "") for a in answers if not a.correct],
    )


async def run_pipeline(
    topology: Path, questions: list[Question], voices: list[Voice], speech: SpeechMaker, typed: bool, run_dir: Path, console: Console
) -> list[Answer]:
    answers: list[Answer] = []
    async with Pipeline.launch(topology, device="cpu", run_dir=run_dir, ready_timeout=300) as pipe:
        if typed:
            for question in questions:
                text, first_audio = await ask(pipe, typed_request(question))
                answers.append(Answer(question.text, TYPED, text, is_correct(text, question), first_audio))
            console.log(f"typed: {sum(a.correct for a in answers)}/{len(questions)}")
        for voice in voices:
            for question in questions:
                text, first_audio = await ask(pipe, spoken_request(speech.speak(question.text, voice)))
                answers.append(Answer(question.text, voice.name, text, is_correct(text, question), first_audio))
            console.log(f"{voice.name}: {sum(a.correct for a in answers if a.mode == voice.name)}/{len(questions)}")
    return answers


def overall(rows: list[Row], answers: list[Answer]) -> Row:
    spoken = [a for a in answers if a.mode != TYPED]
    measured = [r for r in rows if r.wer is not None]
    wer = statistics.mean(r.wer for r in measured if r.wer is not None) if measured else None
    row = summarize("spoken (all voices)", spoken, None)
    row.wer = wer
    row.misses = []
    return row


def print_table(rows: list[Row], settings: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title="Answer quality of the embedded voice assistant")
    for column in ("asked as", "accuracy", "ASR WER", "ASR s/clip", "answer words", "first audio p50"):
        table.add_column(column, justify="left" if column == "asked as" else "right")
    for row in rows:
        table.add_row(
            row.mode,
            f"{row.correct}/{row.asked} ({row.accuracy:.0%})",
            "—" if row.wer is None else f"{row.wer:.1%}",
            "—" if row.asr_s_mean is None else f"{row.asr_s_mean:.2f}",
            f"{row.mean_words:.1f}",
            "—" if row.first_audio_p50_s != row.first_audio_p50_s else f"{row.first_audio_p50_s:.2f} s",
        )
    console.print(table)
    console.print(f"settings: asr={settings.get('asr', {})} thinker={settings.get('thinker', {})}")
    typed = next((row for row in rows if row.mode == TYPED), None)
    spoken = next((row for row in rows if row.mode == "spoken (all voices)"), None)
    if typed is not None and typed.asked:
        console.print(f"goal typed >= 80%: {typed.accuracy:.0%} — {'met' if typed.accuracy >= 0.8 else 'not met'}")
        if spoken is not None and spoken.asked and typed.accuracy > 0:
            ratio = spoken.accuracy / typed.accuracy
            console.print(f"goal spoken >= 90% of typed: {ratio:.0%} — {'met' if ratio >= 0.9 else 'not met'}")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown (for the README), from ``--json``'s ``rows``."""
    lines = ["| asked as | accuracy | ASR WER | answer words | first audio p50 |", "|---|---|---|---|---|"]
    for row in rows:
        wer = "—" if row["wer"] is None else f"{row['wer']:.1%}"
        first = row["first_audio_p50_s"]
        audio = "—" if first != first else f"{first:.2f} s"
        lines.append(f"| {row['mode']} | {row['correct']}/{row['asked']} ({row['accuracy']:.0%}) | {wer} | {row['mean_words']:.1f} | {audio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="ask the first N questions (default: all)")
    parser.add_argument("--voices", default=",".join(str(i) for i in range(len(VOICES))), help="indices into VOICES, comma-separated ('' for none)")
    parser.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE", help="override a stage's factory_args")
    parser.add_argument("--asr-only", action="store_true", help="only the ASR word error rate (no pipeline)")
    parser.add_argument("--no-typed", action="store_true", help="skip the typed questions")
    parser.add_argument("--no-wer", action="store_true", help="skip the standalone ASR pass (no WER column)")
    parser.add_argument("--audio-dir", type=Path, help="cache spoken clips here (default: a temporary folder for this run)")
    parser.add_argument("--misses", action="store_true", help="list every wrong answer")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print the table of an earlier --json run as Markdown, and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown_table(json.loads(args.markdown.read_text())["rows"]))
        return 0

    console = Console(stderr=True)
    questions = list(QUESTIONS[: args.questions])
    voices = [VOICES[int(i)] for i in args.voices.split(",") if i.strip()]
    with tempfile.TemporaryDirectory(prefix="omnictl-answer-quality-") as tmp:
        audio_dir = args.audio_dir or Path(tmp) / "audio"
        speech = SpeechMaker(audio_dir)
        topology, settings = topology_with(parse_overrides(args.set), Path(tmp))
        asr_args = dict(settings.get("asr", {}))
        answers: list[Answer] = []
        if not args.asr_only:  # the pipeline first: its timings should not follow a long ASR pass's heat
            answers = asyncio.run(run_pipeline(topology, questions, voices, speech, not args.no_typed, Path(tmp) / "run", console))
        heard = {} if args.no_wer else transcribe_all(questions, voices, speech, asr_args, console)
        for answer in answers:
            if (answer.mode, answer.question) in heard:
                answer.heard = heard[answer.mode, answer.question][0]
        if args.asr_only:
            rows = [summarize(v.name, [], heard) for v in voices]
        else:
            modes = ([] if args.no_typed else [TYPED]) + [v.name for v in voices]
            rows = [summarize(mode, [a for a in answers if a.mode == mode], heard or None) for mode in modes]
            if voices:
                rows.append(overall([r for r in rows if r.mode != TYPED], answers))
    if args.json:
        payload = {
            "settings": settings,
            "rows": [asdict(row) | {"accuracy": row.accuracy} for row in rows],
            "answers": [asdict(answer) for answer in answers],
            "heard": [{"voice": v, "question": q, "heard": h, "seconds": s} for (v, q), (h, s) in heard.items()],
        }
        json.dump(payload, sys.stdout, indent=1)
        print()
        print_table(rows, settings, console)  # the table still shows, on stderr
    else:
        print_table(rows, settings, Console())
        if args.misses:
            for row in rows:
                for miss in row.misses:
                    print(f"  [{row.mode}] {miss}")
            if args.asr_only:
                for (voice, question), (text, _) in heard.items():
                    if word_errors(question, text)[0]:
                        print(f"  [{voice}] {question!r} heard as {text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
