"""Time to first audio: the staged voice assistant against a sequential script.

Both answer the same spoken sample questions with the same models (Whisper base,
SmolLM2-135M-Instruct greedy, Piper), in one run, question by question, alternating:

- **pipeline**: ``topologies/voice-assistant.yaml`` through ``omnictl.Pipeline`` — the
  thinker streams text into the TTS stage, which speaks each sentence as it completes;
- **sequential**: one process, ASR → the whole answer with ``generate`` → TTS of the
  whole answer; the first audio exists only when everything is done.

Reported per question and as medians: time to first text, time to first audio, total.
Goal (reported, not asserted): the pipeline's first audio comes well before the
sequential script's.

Run: ``python benchmarks/voice_assistant.py [--rounds 2] [--max-tokens 96] [--questions a,b]``
"""

from __future__ import annotations

import sys

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.pipeline import Pipeline
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from omnictl.models.voice_assistant.llm import chat_prompt_ids, load_smollm2
from benchmarks.eval.samples import sample_names, sample_question, sample_request
from omnictl.models.voice_assistant.tts import PiperSpeaker

TOPOLOGY = Path(__file__).resolve().parents[1] / "topologies" / "voice-assistant.yaml"


@dataclass
class Timing:
    first_text: float
    first_audio: float
    total: float
    answer: str


async def ask_pipeline(pipe: Any, name: str, max_tokens: int) -> Timing:
    started = time.perf_counter()
    request = await pipe.submit(sample_request(name, sampling={"max_tokens": max_tokens, "temperature": 0}))
    first_text = first_audio = float("nan")
    async for event in request.events():
        now = time.perf_counter() - started
        if event.kind == "stream" and event.stage == "decode" and first_text != first_text:
            first_text = now
        if event.kind == "stream" and event.stage == "tts" and first_audio != first_audio:
            first_audio = now
    result = await request.result()
    total = time.perf_counter() - started
    return Timing(first_text, first_audio, total, result["decode"].text)


class Sequential:
    """The same three models, one after the other, nothing streamed."""

    def __init__(self) -> None:
        self.recognizer = SpeechRecognizer()
        self.model, self.tokenizer = load_smollm2()
        self.speaker = PiperSpeaker()

    def ask(self, name: str, max_tokens: int) -> Timing:
        import torch

        samples, rate = sample_question(name)
        started = time.perf_counter()
        question = self.recognizer.transcribe(samples, rate)
        ids = torch.tensor([chat_prompt_ids(self.tokenizer, [{"role": "user", "content": question}])])
        with torch.inference_mode():
            generate: Any = self.model.generate
            out = generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False)
        answer = str(self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        answered = time.perf_counter() - started
        self.speaker.synthesize(answer)
        total = time.perf_counter() - started
        return Timing(answered, total, total, answer)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def main(args: argparse.Namespace) -> None:
    console = Console(width=max(Console().width, 140))  # the table has eight columns
    names = args.questions.split(",") if args.questions else sample_names()
    console.print("loading the sequential script's models ...")
    sequential = Sequential()
    console.print("launching the pipeline ...")
    with tempfile.TemporaryDirectory() as run_dir:
        async with Pipeline.launch(TOPOLOGY, device="cpu", run_dir=run_dir) as pipe:
            # Warm both sides once: first forward passes allocate and compile kernels.
            await ask_pipeline(pipe, names[0], 8)
            sequential.ask(names[0], 8)
            rows: list[tuple[str, Timing, Timing]] = []
            for _ in range(args.rounds):
                for name in names:
                    staged = await ask_pipeline(pipe, name, args.max_tokens)
                    plain = sequential.ask(name, args.max_tokens)
                    rows.append((name, staged, plain))

    table = Table(title=f"voice assistant: time to first audio (s), max_tokens={args.max_tokens}, greedy")
    for column in ("question", "answer words", "pipe first text", "pipe first audio", "pipe total", "seq first audio (= total)", "first audio speed-up", "same answer"):
        table.add_column(column, justify="right" if column != "question" else "left")
    for name, staged, plain in rows:
        table.add_row(
            name,
            str(len(plain.answer.split())),
            f"{staged.first_text:.2f}",
            f"{staged.first_audio:.2f}",
            f"{staged.total:.2f}",
            f"{plain.first_audio:.2f}",
            f"{plain.first_audio / staged.first_audio:.1f}x",
            "yes" if staged.answer.strip() == plain.answer.strip() else "no",
        )
    console.print(table)
    pipe_ttfa = median([s.first_audio for _, s, _ in rows])
    seq_ttfa = median([p.first_audio for _, _, p in rows])
    console.print(
        f"median time to first audio: pipeline {pipe_ttfa:.2f} s, sequential {seq_ttfa:.2f} s "
        f"({seq_ttfa / pipe_ttfa:.1f}x sooner); median time to first text: pipeline "
        f"{median([s.first_text for _, s, _ in rows]):.2f} s, sequential {median([p.first_text for _, _, p in rows]):.2f} s; "
        f"median total: pipeline {median([s.total for _, s, _ in rows]):.2f} s, sequential {median([p.total for _, _, p in rows]):.2f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--questions", default="", help=f"comma-separated, from: {', '.join(sample_names())}")
    asyncio.run(main(parser.parse_args()))
