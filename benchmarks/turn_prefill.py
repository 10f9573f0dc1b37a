"""Each turn prefills only its new tokens: thinker time to first token at turn 1 and turn 5, prefix caching on and off.

A conversation grows turn by turn: turn N's prompt is turn N-1's prompt, its answer and the
new question. With vLLM's prefix caching (``VllmOptions.prefix_caching``, on by default)
the KV cache of what an earlier turn already prefilled is reused, so turn 5 should cost
about what turn 1 does; without it, every turn prefills the whole conversation again.

Side by side in one run: two pipelines of the embedded voice assistant's thinker (its
``preprocessing``, ``thinker`` and ``decode`` stages with the shipped settings: system
prompt, one-sentence answers, ``max_tokens``), on vLLM, one with ``prefix_caching: true``
and one with ``false``, both up at once. Each round is one conversation of five typed
turns (chat messages: the previous turns with the thinker's own answers, then the new
question), asked of both pipelines turn by turn, alternating which goes first. Time to
first token: from ``submit`` to the first text delta (the thinker's prefill plus the
pipeline's hops, the same for both). Each round a different conversation, so no turn's
whole prompt is cached from an earlier round (the system prompt is, on the caching
pipeline, as on a server).

Also checked, per turn: the prompt the thinker tokenizes for turn N starts with exactly
turn N-1's prompt tokens (what prefix reuse needs; a template that changes earlier tokens
between turns would defeat the cache), and the prompt's length in tokens.

Goal (printed met / not met): with caching, turn-5 TTFT <= 1.25 x turn-1 TTFT (medians
over the rounds).

Run: ``python benchmarks/turn_prefill.py [--rounds 3] [--vllm block_size=32]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.data import data_path
from omnictl.models.voice_assistant.llm import smollm2_checkpoint
from omnictl.pipeline import Pipeline

GOAL_RATIO = 1.25
CONVERSATIONS = [
    ["What is the capital of France?", "How many people live there?", "Which river runs through it?",
     "What is its most famous tower?", "When was that tower built?"],
    ["What is the largest planet in the solar system?", "What is it made of?", "How many moons does it have?",
     "Which of them is the biggest?", "Could people live there?"],
    ["How many legs does a spider have?", "Do spiders have bones?", "What do they eat?",
     "How do they catch their food?", "Are any of them dangerous?"],
    ["What colour is the sky?", "Why is it that colour?", "What colour is it at sunset?",
     "Is it the same on Mars?", "What colour is the sky on the Moon?"],
]
CONFIGS = {"cached": True, "uncached": False}


def thinker_topology(out_dir: Path, prefix_caching: bool, engine: dict[str, Any]) -> Path:
    """The shipped voice assistant cut to typed text in, text out, its thinker on vLLM."""
    spec = yaml.safe_load(data_path("voice-assistant.yaml").read_text())
    stages = {stage["name"]: stage for stage in spec["stages"]}
    preprocessing, thinker, decode = stages["preprocessing"], stages["thinker"], stages["decode"]
    preprocessing.pop("route_fn", None)
    preprocessing["next"] = ["thinker"]
    args = thinker.setdefault("factory_args", {})
    args["engine"] = "vllm"
    args["vllm"] = {**(args.get("vllm") or {}), **engine, "prefix_caching": prefix_caching}
    thinker["wait_for"] = ["preprocessing"]
    thinker["next"] = ["decode"]
    thinker["stream_to"] = ["decode"]
    spec["name"] = f"turn-prefill-{'cached' if prefix_caching else 'uncached'}"
    spec["stages"] = [preprocessing, thinker, decode]
    path = out_dir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


async def ask(pipe: Pipeline, messages: list[dict[str, str]]) -> tuple[float, str]:
    """(time to the first text delta, the whole answer) of one turn."""
    started = time.perf_counter()
    request = await pipe.submit({"messages": messages, "sampling": {"temperature": 0}}, modalities=["text"])
    first = float("nan")
    async for event in request.events():
        if event.kind == "stream" and first != first:
            first = time.perf_counter() - started
        if event.kind == "error":
            raise RuntimeError(f"turn failed: {event.error}")
    result = await request.result()
    return first, str(result["decode"].text).strip()


def prompt_tokens(messages: list[dict[str, str]], system_prompt: str | None) -> list[int]:
    """The prompt the vLLM thinker tokenizes for ``messages`` (its own ``prompt_ids``)."""
    from omnictl.schedulers.vllm_engine import VllmScheduler

    global _SCHEDULER
    if _SCHEDULER is None:  # the tokenizer only: no engine is started
        _SCHEDULER = VllmScheduler(str(smollm2_checkpoint()), system_prompt=system_prompt)
    return _SCHEDULER.prompt_ids({"messages": messages})


_SCHEDULER: Any = None


async def measure(args: argparse.Namespace) -> int:
    engine = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.vllm)}
    shipped = yaml.safe_load(data_path("voice-assistant.yaml").read_text())
    system_prompt = next(s for s in shipped["stages"] if s["name"] == "thinker")["factory_args"].get("system_prompt")
    ttft: dict[str, list[list[float]]] = {name: [[] for _ in range(5)] for name in CONFIGS}
    lengths: list[list[int]] = [[] for _ in range(5)]
    prefix_kept = True
    with tempfile.TemporaryDirectory(prefix="omnictl-turn-prefill-") as tmp:
        paths = {name: thinker_topology(Path(tmp), caching, engine) for name, caching in CONFIGS.items()}
        async with Pipeline.launch(paths["cached"], device="cpu", profile=False, ready_timeout=600) as cached, \
                Pipeline.launch(paths["uncached"], device="cpu", profile=False, ready_timeout=600) as uncached:
            pipes = {"cached": cached, "uncached": uncached}
            for pipe in pipes.values():  # warm-up: a question from no conversation below
                await ask(pipe, [{"role": "user", "content": "Hello, who are you?"}])
            for round_index in range(args.rounds):
                questions = CONVERSATIONS[round_index % len(CONVERSATIONS)]
                histories: dict[str, list[dict[str, str]]] = {name: [] for name in pipes}
                previous: list[int] | None = None
                order = list(pipes) if round_index % 2 == 0 else list(reversed(pipes))
                for turn, question in enumerate(questions):
                    for name in order:
                        messages = [*histories[name], {"role": "user", "content": question}]
                        first, answer = await ask(pipes[name], messages)
                        ttft[name][turn].append(first)
                        histories[name] = [*messages, {"role": "assistant", "content": answer}]
                        if name == "cached":
                            ids = prompt_tokens(messages, system_prompt)
                            lengths[turn].append(len(ids))
                            if previous is not None and ids[: len(previous)] != previous:
                                prefix_kept = False
                                print(f"round {round_index + 1} turn {turn + 1}: the prompt does not start with turn {turn}'s")
                            previous = ids
                print(f"round {round_index + 1}/{args.rounds}: " + "; ".join(
                    f"{name} turn 1 {ttft[name][0][-1] * 1000:.0f} ms, turn 5 {ttft[name][4][-1] * 1000:.0f} ms" for name in pipes))
    print(f"\nthinker time to first token (ms, median of {args.rounds} conversations; prompt tokens by turn)")
    print(f"{'turn':>4} {'prompt tokens':>14} {'cached':>8} {'uncached':>9}")
    for turn in range(5):
        print(f"{turn + 1:>4} {statistics.median(lengths[turn]):>14.0f} "
              f"{statistics.median(ttft['cached'][turn]) * 1000:>8.0f} {statistics.median(ttft['uncached'][turn]) * 1000:>9.0f}")
    first, fifth = statistics.median(ttft["cached"][0]), statistics.median(ttft["cached"][4])
    ratio = fifth / first
    print(f"turn N's prompt starts with turn N-1's prompt tokens: {'yes' if prefix_kept else 'NO'}")
    print(f"goal with caching: turn-5 TTFT {fifth * 1000:.0f} ms <= {GOAL_RATIO} x turn-1 {first * 1000:.0f} ms "
          f"(ratio {ratio:.2f}): {'met' if ratio <= GOAL_RATIO else 'NOT met'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="conversations (each a different one, up to 4, then again)")
    parser.add_argument("--vllm", action="append", default=[], metavar="KEY=VALUE",
                        help="an engine option for both pipelines (factory_args.vllm), e.g. kv_cache_gib=1")
    return asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
