"""Time to first audio of the embedded voice assistant against its floor and a sequential script.

One run, side by side, question by question (spoken Piper samples), at three answer
lengths (short: the embedded defaults, one sentence; medium and long: a system message
asking for more, and a higher ``max_tokens``):

- **floor** (short answers only): each model alone in this process, with the machine
  otherwise idle (the pipeline waits between requests), and the same settings as the
  topology: the ASR time on the clip + the LLM's time to the text of the first piece the
  TTS stage's splitter hands out (a short clause: ``tts.first_words``) + Piper's time to
  synthesise that piece;
- **sequential**: one process, ASR → the whole answer (greedy, the same runner and
  stopping rules as the pipeline's thinker) → TTS of the whole answer (first audio = total);
- **pipeline**: ``omnictl/data/voice-assistant.yaml`` through ``omnictl.Pipeline``, its
  first audio the first ``tts`` stream event.

Goals (reported, not asserted): short answers' first audio ≤ 1.25 × floor; at every
length the pipeline's first audio and total ≤ the sequential script's. Medians over
questions and rounds. ``--set STAGE.KEY=VALUE`` tries a setting without editing the
topology (it applies to the floor and the sequential script too where they share it).

Before and after the short first clause: ``--set tts.first_words=null`` (the first piece a
whole sentence) against the default.

Run: ``python benchmarks/first_audio.py [--rounds 2] [--questions a,b] [--lengths short,medium,long] [--set thinker.threads=1]``
"""

from __future__ import annotations

import sys

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.data import data_path
from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner, with_system_prompt
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from omnictl.models.voice_assistant.llm import load_smollm2, set_threads
from benchmarks.eval.samples import sample_names, sample_question, sample_request
from omnictl.models.voice_assistant.tts import FIRST_WORDS, RAMP_MIN_CHARS, PiperSpeaker, SentenceSplitter, speakable
from omnictl.pipeline import Pipeline

TOPOLOGY = data_path("voice-assistant.yaml")
LONGER = "You are a voice assistant. Answer in a few sentences, with some detail."
# answer length -> (system message of the request, or None for the topology's; max_tokens)
LENGTHS: dict[str, tuple[str | None, int]] = {"short": (None, 32), "medium": (LONGER, 64), "long": (LONGER, 160)}
GOAL_FLOOR_RATIO = 1.25


@dataclass
class Timing:
    first_audio: float
    total: float
    answer: str


@dataclass
class Floor:
    asr: float
    llm_first_piece: float
    tts_first_chunk: float

    @property
    def total(self) -> float:
        return self.asr + self.llm_first_piece + self.tts_first_chunk


@dataclass
class Results:
    pipeline: dict[str, list[Timing]] = field(default_factory=dict)
    sequential: dict[str, list[Timing]] = field(default_factory=dict)
    floors: list[Floor] = field(default_factory=list)


def topology_with(overrides: list[str], out_dir: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The embedded topology with ``STAGE.KEY=VALUE`` factory_args overrides, and every stage's args."""
    spec = yaml.safe_load(TOPOLOGY.read_text())
    stages = {stage["name"]: stage for stage in spec["stages"]}
    for item in overrides:
        target, sep, raw = item.partition("=")
        stage, dot, key = target.partition(".")
        if not sep or not dot or stage not in stages:
            raise SystemExit(f"--set {item!r}: expected STAGE.KEY=VALUE with a stage of {', '.join(stages)}")
        stages[stage].setdefault("factory_args", {})[key] = yaml.safe_load(raw)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "voice-assistant.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, {name: dict(stage.get("factory_args") or {}) for name, stage in stages.items()}


def messages_for(length: str, question: str | None, thinker: dict[str, Any]) -> list[dict[str, Any]]:
    system, _ = LENGTHS[length]
    messages: list[dict[str, Any]] = [{"role": "user", "content": question or ""}]
    return with_system_prompt(messages, system or thinker.get("system_prompt"))  # type: ignore[no-any-return]


class Models:
    """The three models in this process, with the topology's settings (every core each)."""

    def __init__(self, settings: dict[str, dict[str, Any]]) -> None:
        # Every core for each model, whatever the topology gives its stage: the floor and
        # the sequential script have the machine to themselves.
        self.recognizer = SpeechRecognizer(**(settings["asr"] | {"cpu_threads": 0}))
        thinker = settings["thinker"]
        set_threads(0)
        self.model, self.tokenizer = load_smollm2("cpu")
        shaping = {"system_prompt": thinker.get("system_prompt"), "repetition_penalty": thinker.get("repetition_penalty", 1.0),
                   "no_repeat_ngram": thinker.get("no_repeat_ngram", 0)}
        # The pipeline's thinker for short answers (its sentence cap ends the answer with one
        # more step that says end-of-answer), and one without a cap for longer answers.
        self.capped = SpokenAnswerRunner(self.model, self.tokenizer, max_sentences=thinker.get("max_sentences"), **shaping)
        self.runner = SpokenAnswerRunner(self.model, self.tokenizer, max_sentences=None, **shaping)
        self.thinker = thinker
        self.speaker = PiperSpeaker(settings["tts"].get("voice", "joe"))
        self.max_piece = int(settings["tts"].get("max_sentence_chars", 250))
        self.first_words = settings["tts"].get("first_words", FIRST_WORDS)

    def splitter(self) -> SentenceSplitter:
        """The TTS stage's splitter with the topology's settings."""
        first = self.first_words
        return SentenceSplitter(self.max_piece, first_words=(int(first[0]), int(first[1])) if first else None,
                                clause_chars=RAMP_MIN_CHARS if first else None)

    def answer(self, question: str, length: str, first_piece: bool = False) -> str:
        """The greedy answer as the pipeline's thinker writes it (short: with its sentence
        cap), or (the floor) its text up to where the TTS stage's splitter hands out its
        first piece, no step after it."""
        runner = self.capped if length == "short" and not first_piece else self.runner
        output = runner.prefill("local", {"messages": messages_for(length, question, self.thinker)})
        tokens: list[int] = []
        stop = runner.stop_token_ids()
        splitter, fed = self.splitter(), ""
        try:
            for _ in range(LENGTHS[length][1]):
                token = int(output.logits.argmax())
                if token in stop:
                    break
                tokens.append(token)
                if first_piece:
                    text = runner.detokenize(tokens)
                    delta, fed = text[len(fed):], text
                    if splitter.feed(delta):
                        break
                output = runner.decode(["local"], [token])[0]
        finally:
            runner.release("local")
        return runner.detokenize(tokens)

    def floor(self, clip: np.ndarray, rate: int) -> Floor:
        started = time.perf_counter()
        question = self.recognizer.transcribe(clip, rate)
        asr = time.perf_counter() - started
        started = time.perf_counter()
        answer = self.answer(question, "short", first_piece=True)
        llm = time.perf_counter() - started
        splitter = self.splitter()
        pieces = [p for p in splitter.feed(answer + " ") + splitter.flush() if speakable(p)]
        started = time.perf_counter()
        self.speaker.synthesize(pieces[0] if pieces else "")
        return Floor(asr, llm, time.perf_counter() - started)

    def sequential(self, clip: np.ndarray, rate: int, length: str) -> Timing:
        """ASR, then the whole answer, then all of TTS."""
        started = time.perf_counter()
        question = self.recognizer.transcribe(clip, rate)
        answer = self.answer(question, length)
        self.speaker.synthesize(answer)
        total = time.perf_counter() - started
        return Timing(total, total, answer)


async def ask_pipeline(pipe: Any, name: str, length: str, thinker: dict[str, Any]) -> Timing:
    system, max_tokens = LENGTHS[length]
    inputs = sample_request(name, sampling={"max_tokens": max_tokens, "temperature": 0})
    if system is not None:
        inputs["messages"].insert(0, {"role": "system", "content": system})
    started = time.perf_counter()
    request = await pipe.submit(inputs)
    first_audio = float("nan")
    async for event in request.events():
        if event.kind == "stream" and event.stage == "tts" and first_audio != first_audio:
            first_audio = time.perf_counter() - started
    result = await request.result()
    return Timing(first_audio, time.perf_counter() - started, str(result["decode"].text))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def measure(args: argparse.Namespace, console: Console) -> tuple[Results, dict[str, dict[str, Any]]]:
    names = args.questions.split(",") if args.questions else sample_names()
    lengths = args.lengths.split(",")
    results = Results(pipeline={n: [] for n in lengths}, sequential={n: [] for n in lengths})
    with tempfile.TemporaryDirectory(prefix="omnictl-first-audio-") as tmp:
        topology, settings = topology_with(args.set, Path(tmp))
        # The pipeline's thinker stops at max_sentences; medium and long answers need it off.
        if any(length != "short" for length in lengths):
            long_topology, _ = topology_with([*args.set, "thinker.max_sentences=null"], Path(tmp) / "long")
        console.log(f"settings: asr={settings['asr']} thinker={ {k: v for k, v in settings['thinker'].items() if k != 'system_prompt'} }")
        models = Models(settings)
        clips = {name: sample_question(name) for name in names}
        for name in names[:1]:  # warm-up: first calls allocate and pick kernels
            models.floor(*clips[name])
            models.sequential(*clips[name], "short")
        for length_group in (["short"] if "short" in lengths else []), [n for n in lengths if n != "short"]:
            if not length_group:
                continue
            path = topology if length_group == ["short"] else long_topology
            (Path(tmp) / length_group[0]).mkdir(exist_ok=True)
            async with Pipeline.launch(path, device="cpu", run_dir=Path(tmp) / length_group[0] / "run", ready_timeout=300) as pipe:
                await ask_pipeline(pipe, names[0], length_group[0], settings["thinker"])  # warm-up
                for round_index in range(args.rounds):
                    for name in names:
                        for length in length_group:
                            # alternate who goes first, so a load that comes and goes is shared
                            if round_index % 2 == 0:
                                results.pipeline[length].append(await ask_pipeline(pipe, name, length, settings["thinker"]))
                                results.sequential[length].append(models.sequential(*clips[name], length))
                            else:
                                results.sequential[length].append(models.sequential(*clips[name], length))
                                results.pipeline[length].append(await ask_pipeline(pipe, name, length, settings["thinker"]))
                            if length == "short":
                                results.floors.append(models.floor(*clips[name]))
                    console.log(f"round {round_index + 1}/{args.rounds}: {', '.join(length_group)}")
    return results, settings


def report(results: Results, console: Console) -> None:
    table = Table(title="voice assistant: first audio and total (s), medians")
    for column in ("answer", "answer words", "pipeline first audio", "pipeline total", "sequential first audio = total", "first audio ×", "same answer"):
        table.add_column(column, justify="left" if column == "answer" else "right")
    goals: list[tuple[str, str, bool]] = []
    for length, staged in results.pipeline.items():
        plain = results.sequential[length]
        if not staged:
            continue
        words = median([float(len(t.answer.split())) for t in plain])
        pipe_first, pipe_total, seq_total = median([t.first_audio for t in staged]), median([t.total for t in staged]), median([t.total for t in plain])
        same = sum(s.answer.strip() == p.answer.strip() for s, p in zip(staged, plain))
        table.add_row(length, f"{words:.0f}", f"{pipe_first:.2f}", f"{pipe_total:.2f}", f"{seq_total:.2f}", f"{seq_total / pipe_first:.1f}x", f"{same}/{len(staged)}")
        goals.append((f"{length}: pipeline first audio {pipe_first:.2f} s <= sequential {seq_total:.2f} s", "", pipe_first <= seq_total))
        goals.append((f"{length}: pipeline total {pipe_total:.2f} s <= sequential {seq_total:.2f} s", "", pipe_total <= seq_total))
    console.print(table)
    if results.floors:
        floor = Floor(median([f.asr for f in results.floors]), median([f.llm_first_piece for f in results.floors]),
                      median([f.tts_first_chunk for f in results.floors]))
        ratios = [s.first_audio / f.total for s, f in zip(results.pipeline["short"], results.floors)]
        console.print(
            f"floor (short answers, medians): ASR {floor.asr:.2f} s + LLM to the first piece's end {floor.llm_first_piece:.2f} s "
            f"+ TTS to the first audio {floor.tts_first_chunk:.2f} s = {median([f.total for f in results.floors]):.2f} s")
        ratio = median(ratios)
        goals.insert(0, (f"short: first audio / floor = {ratio:.2f} (median of per-question ratios) <= {GOAL_FLOOR_RATIO}", "", ratio <= GOAL_FLOOR_RATIO))
    for text, _, met in goals:
        console.print(f"goal {text}: {'met' if met else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--questions", default="", help=f"comma-separated, from: {', '.join(sample_names())}")
    parser.add_argument("--lengths", default="short,medium,long", help=f"comma-separated, from: {', '.join(LENGTHS)}")
    parser.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE", help="override a stage's factory_args")
    args = parser.parse_args()
    unknown = [n for n in args.lengths.split(",") if n not in LENGTHS]
    if unknown:
        raise SystemExit(f"--lengths: unknown {unknown}; known: {', '.join(LENGTHS)}")
    console = Console(width=max(Console().width, 140))
    results, _ = asyncio.run(measure(args, console))
    report(results, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
