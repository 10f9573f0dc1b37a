"""The voice assistant's thinker on its two engines, against vLLM alone, in one run.

Same model (SmolLM2-135M-Instruct, float32, converted from the packaged GGUF), same
system prompt (the shipped thinker's), greedy, the same ``max_tokens`` (32), no sentence
cap (every answer runs to its end-of-answer token or to ``max_tokens``), the same
questions, side by side:

- **(a) hf**: ``thinker`` (``engine: hf``) → ``decode`` through ``omnictl.Pipeline``
  (stage processes, ZeroMQ), the thinker's shipped settings otherwise;
- **(b) vllm stage**: the same topology with ``engine: vllm``;
- **(c) vllm alone**: vLLM's ``AsyncLLM`` in this process, the same engine options,
  the same prompt token ids.

At each concurrency (1, 8, 32: that many requests in flight, each one replaced when it
ends, ``--requests`` in all) it prints tokens/s (completion tokens over wall time) and
time to first token (p50: the first text event through the pipeline, the first output
of ``generate`` alone). Every setup answers one warm-up request first. Setups run one
after another, (a) first (never two engines at once on this machine).

``--first-audio``: also the whole voice assistant (``omnictl/data/voice-assistant.yaml``:
ASR, thinker, TTS) with its thinker on each engine (shipped settings otherwise), spoken
sample questions, first audio (the first ``tts`` stream event) p50 at c=1 and c=8, and
the time each launch took until the pipeline was ready (what the engine adds to a start).

Goals (reported, not asserted): the vLLM stage reaches ≥ 90% of vLLM alone's tokens/s
at c=32 and ≥ 2× the HF runner's; its time to first token at c=1 is within 1.2× of vLLM
alone's; (``--first-audio``) the voice assistant's first audio at c=1 is no worse with
the vLLM thinker, and at c=8 its p50 is better.

Run: ``python benchmarks/engine.py [--quick] [--first-audio] [--eager/--no-eager] [--kv-cache-gib 1] [--only abc]``
"""

from __future__ import annotations

import sys

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import yaml

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.data import data_path
from omnictl.models.voice_assistant.llm import smollm2_checkpoint
from benchmarks.eval.quality import QUESTIONS as QUALITY_QUESTIONS
from benchmarks.eval.samples import QUESTIONS as SAMPLE_QUESTIONS
from omnictl.pipeline import Pipeline

MAX_TOKENS = 32
CONCURRENCY = (1, 8, 32)
GOAL_OF_ALONE = 0.90
GOAL_OVER_HF = 2.0
GOAL_TTFT = 1.2


@dataclass
class Figures:
    tokens: int
    seconds: float
    ttft: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.ttft)


def questions() -> list[str]:
    asked = list(SAMPLE_QUESTIONS.values()) + [q.text for q in QUALITY_QUESTIONS]
    return list(dict.fromkeys(asked))


def shipped_system_prompt() -> str:
    topology = yaml.safe_load(Path(data_path("voice-assistant.yaml")).read_text())
    (thinker,) = [s for s in topology["stages"] if s["name"] == "thinker"]
    return str(thinker["factory_args"]["system_prompt"])


async def closed_loop(concurrency: int, total: int, one: Callable[[str], Awaitable[tuple[int, float]]]) -> Figures:
    """``total`` requests, ``concurrency`` in flight; ``one(question) -> (tokens, ttft)``."""
    asked = itertools.cycle(questions())
    tokens, ttft = 0, []
    remaining = total

    async def worker() -> None:
        nonlocal tokens, remaining
        while remaining > 0:
            remaining -= 1
            n, first = await one(next(asked))
            tokens += n
            ttft.append(first)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Figures(tokens, time.perf_counter() - started, ttft)


def topology(tmp: Path, engine: str, engine_options: dict[str, Any]) -> Path:
    args: dict[str, Any] = {"engine": engine, "system_prompt": shipped_system_prompt(), "max_sentences": None,
                            "max_tokens": MAX_TOKENS, "temperature": 0.0, "max_batch": 32}
    if engine == "vllm":
        args["vllm"] = engine_options
    document = {
        "name": f"thinker-{engine}",
        "stages": [
            {"name": "thinker", "factory": "omnictl.models.voice_assistant.stages.thinker", "factory_args": args,
             "process": "llm", "next": ["decode"], "stream_to": ["decode"]},
            {"name": "decode", "factory": "omnictl.models.voice_assistant.stages.decode", "process": "llm",
             "terminal": True, "modality": "text"},
        ],
    }
    path = tmp / f"thinker-{engine}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


async def through_pipeline(path: Path, plan: dict[int, int]) -> dict[int, Figures]:
    pipe = await Pipeline.launch(path, profile=False, ready_timeout=900.0)
    try:
        async def one(question: str) -> tuple[int, float]:
            started = time.perf_counter()
            handle = await pipe.submit({"messages": [{"role": "user", "content": question}],
                                        "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0.0}})
            first = None
            tokens = 0
            async for event in handle.events():
                if event.kind.value == "stream" and first is None and event.data.text:
                    first = time.perf_counter() - started
                elif event.kind.value == "result":
                    tokens = event.data.completion_tokens
                elif event.kind.value in ("error", "aborted"):
                    raise RuntimeError(f"request failed: {event.error}")
            return tokens, first if first is not None else time.perf_counter() - started

        await one("Hello!")  # warm-up
        return {c: await closed_loop(c, n, one) for c, n in plan.items()}
    finally:
        await pipe.close()


async def vllm_alone(engine_options: dict[str, Any], plan: dict[int, int]) -> dict[int, Figures]:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from omnictl.schedulers.vllm_engine import VllmOptions

    model = str(smollm2_checkpoint())
    options = VllmOptions.from_mapping(engine_options)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(options.kv_cache_gib)
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    system = shipped_system_prompt()
    engine = AsyncLLM.from_engine_args(options.engine_args(model))
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, output_kind=RequestOutputKind.DELTA)
    ids = itertools.count()
    try:
        async def one(question: str) -> tuple[int, float]:
            started = time.perf_counter()
            prompt = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                    {"role": "user", "content": question}],
                                                   add_generation_prompt=True, tokenize=True, return_dict=False)
            first = None
            tokens = 0
            async for out in engine.generate(TokensPrompt(prompt_token_ids=list(prompt)), sampling, f"r{next(ids)}"):
                tokens += len(out.outputs[0].token_ids)
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter() - started
            return tokens, first or 0.0

        await one("Hello!")
        return {c: await closed_loop(c, n, one) for c, n in plan.items()}
    finally:
        engine.shutdown()
        del engine  # now, not in __del__ at interpreter exit (when vLLM's modules are gone)


def voice_assistant(tmp: Path, engine: str, engine_options: dict[str, Any]) -> Path:
    document = yaml.safe_load(Path(data_path("voice-assistant.yaml")).read_text())
    for stage in document["stages"]:
        if stage["name"] == "thinker":
            stage["factory_args"]["engine"] = engine
            if engine == "vllm":
                stage["factory_args"]["vllm"] = engine_options
    path = tmp / f"voice-assistant-{engine}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


async def first_audio(path: Path, plan: dict[int, int]) -> tuple[float, dict[int, list[float]]]:
    """The launch (seconds until ready) and first audio (seconds) of spoken sample
    questions, per concurrency."""
    from benchmarks.eval.samples import sample_names, sample_request

    launched = time.perf_counter()
    pipe = await Pipeline.launch(path, profile=False, ready_timeout=900.0)
    launch_s = time.perf_counter() - launched
    names = itertools.cycle(sample_names())
    try:
        async def one(name: str) -> float:
            started = time.perf_counter()
            handle = await pipe.submit(sample_request(name, sampling={"temperature": 0.0}))
            first = None
            async for event in handle.events():
                if event.kind.value == "stream" and event.stage == "tts" and first is None:
                    first = time.perf_counter() - started
                elif event.kind.value in ("error", "aborted"):
                    raise RuntimeError(f"request failed: {event.error}")
            return first if first is not None else float("nan")

        await one(next(names))  # warm-up
        out: dict[int, list[float]] = {}
        for concurrency, total in plan.items():
            batch: list[float] = []
            for start in range(0, total, concurrency):
                batch += await asyncio.gather(*(one(next(names)) for _ in range(min(concurrency, total - start))))
            out[concurrency] = batch
        return launch_s, out
    finally:
        await pipe.close()


def report_first_audio(results: dict[str, dict[int, list[float]]], launches: dict[str, float]) -> None:
    hf, vllm = results["hf"], results["vllm"]
    print(f"\nvoice assistant launch (until ready): hf thinker {launches['hf']:.1f} s, "
          f"vllm thinker {launches['vllm']:.1f} s")
    for c in hf:
        print(f"voice assistant first audio p50 at c={c}: hf thinker {statistics.median(hf[c]):.2f} s, "
              f"vllm thinker {statistics.median(vllm[c]):.2f} s")
    one, eight = min(hf), max(hf)
    print(f"first audio at c={one} no worse with vLLM: "
          f"{verdict(statistics.median(vllm[one]) <= statistics.median(hf[one]))}")
    print(f"first audio p50 at c={eight} better with vLLM: "
          f"{verdict(statistics.median(vllm[eight]) < statistics.median(hf[eight]))}")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(results: dict[str, dict[int, Figures]]) -> None:
    print(f"\n{'setup':<22}" + "".join(f"{'tok/s c=' + str(c):>13}" for c in CONCURRENCY)
          + "".join(f"{'TTFT c=' + str(c):>13}" for c in CONCURRENCY))
    for name, figures in results.items():
        print(f"{name:<22}" + "".join(f"{figures[c].tokens_per_s:>13.1f}" for c in CONCURRENCY)
              + "".join(f"{figures[c].ttft_p50 * 1000:>11.0f}ms" for c in CONCURRENCY))
    print("\n" + " ".join(f"{name}: {sum(f.tokens for f in figures.values())} tokens" for name, figures in results.items()))
    hf, stage, alone = results["(a) hf pipeline"], results["(b) vllm pipeline"], results["(c) vllm alone"]
    top = CONCURRENCY[-1]
    of_alone = stage[top].tokens_per_s / alone[top].tokens_per_s
    over_hf = stage[top].tokens_per_s / hf[top].tokens_per_s
    ttft = stage[1].ttft_p50 / alone[1].ttft_p50
    print(f"\nvLLM stage at c={top}: {of_alone:.0%} of vLLM alone's tokens/s (goal >= {GOAL_OF_ALONE:.0%}): "
          f"{verdict(of_alone >= GOAL_OF_ALONE)}")
    print(f"vLLM stage at c={top}: {over_hf:.2f}x the HF runner's tokens/s (goal >= {GOAL_OVER_HF:.1f}x): "
          f"{verdict(over_hf >= GOAL_OVER_HF)}")
    print(f"vLLM stage TTFT at c=1: {ttft:.2f}x vLLM alone's (goal <= {GOAL_TTFT:.1f}x): {verdict(ttft <= GOAL_TTFT)}")
    for c in CONCURRENCY:
        print(f"c={c}: vLLM stage / HF runner tokens/s {stage[c].tokens_per_s / hf[c].tokens_per_s:.2f}x, "
              f"TTFT {stage[c].ttft_p50 / hf[c].ttft_p50:.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per concurrency (a shared machine)")
    parser.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM without torch.compile (the shipped default)")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--only", default="abc", help="which setups to run, e.g. 'bc' ('' for none)")
    parser.add_argument("--first-audio", action="store_true", help="also the whole voice assistant on each engine")
    args = parser.parse_args()
    plan = {1: 4, 8: 16, 32: 32} if args.quick else {1: 10, 8: 32, 32: 64}
    engine_options = {"enforce_eager": args.eager, "kv_cache_gib": args.kv_cache_gib, "max_num_seqs": 32,
                      "max_model_len": 2048}
    print(f"plan (concurrency: requests) {plan}; max_tokens {MAX_TOKENS}; vLLM {engine_options}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    results: dict[str, dict[int, Figures]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # (a) first, then (b), then (c): vLLM, once imported here, sets environment variables
        # in this process (LD_PRELOAD, OMP_NUM_THREADS, ...) that stage processes launched
        # after it would inherit.
        if "a" in args.only:
            results["(a) hf pipeline"] = await through_pipeline(topology(Path(tmp), "hf", engine_options), plan)
            print("(a) done", flush=True)
        if "b" in args.only:
            results["(b) vllm pipeline"] = await through_pipeline(topology(Path(tmp), "vllm", engine_options), plan)
            print("(b) done", flush=True)
        if "c" in args.only:
            results["(c) vllm alone"] = await vllm_alone(engine_options, plan)
            print("(c) done", flush=True)
        audio = {}
        launches: dict[str, float] = {}
        if args.first_audio:
            audio_plan = {1: 3, 8: 8} if args.quick else {1: 5, 8: 16}
            for engine in ("hf", "vllm"):
                launches[engine], audio[engine] = await first_audio(
                    voice_assistant(Path(tmp), engine, engine_options), audio_plan)
                print(f"first audio on {engine} done", flush=True)
    if set(args.only) >= set("abc"):
        report(results)
    if audio:
        report_first_audio(audio, launches)
    if results and not set(args.only) >= set("abc"):
        for name, figures in results.items():
            print(name, {c: (round(f.tokens_per_s, 1), round(f.ttft_p50 * 1000)) for c, f in figures.items()})


if __name__ == "__main__":
    asyncio.run(main())
