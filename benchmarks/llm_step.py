"""Where the thinker's time per token goes: SmolLM2-135M-Instruct on this CPU.

One run, side by side, at 1 thread and at every core, for the same greedy answer:

- **weights**: copying every float32 weight once (reads all of them, and writes as much)
  — above the memory-bandwidth floor of one decode step, which reads each weight once;
- **lm_head**: the output projection alone (49,152 × 576, a fifth of the weights);
- **forward**: ``model(...)`` with a KV cache, one token;
- **runner**: the thinker's :class:`SpokenAnswerRunner.decode` (forward plus the batch
  cache, repetition shaping and the sentence cap);
- **generate**: transformers' ``generate`` per new token.

Medians in ms per token over ``--tokens`` steps, ``--rounds`` times (interleaved).

Run: ``python benchmarks/llm_step.py [--tokens 32] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner
from omnictl.models.voice_assistant.llm import chat_prompt_ids, load_smollm2

MESSAGES = [
    {"role": "system", "content": "You are a voice assistant. Answer in a few sentences, with some detail."},
    {"role": "user", "content": "What is the capital of France?"},
]


def per_step(step: Callable[[], object], steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps * 1000


def weights_ms(model: Any) -> float:
    tensors = [p.detach() for p in model.parameters()]
    started = time.perf_counter()
    for tensor in tensors:
        tensor.clone()
    return (time.perf_counter() - started) * 1000


@torch.inference_mode()
def forward_ms(model: Any, ids: torch.Tensor, steps: int) -> float:
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[0, -1].argmax().view(1, 1)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[0, -1].argmax().view(1, 1)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def runner_ms(runner: SpokenAnswerRunner, steps: int) -> float:
    output = runner.prefill("r", {"messages": MESSAGES})
    times = []
    try:
        for _ in range(steps):
            token = int(output.logits.argmax())
            started = time.perf_counter()
            output = runner.decode(["r"], [token])[0]
            times.append(time.perf_counter() - started)
    finally:
        runner.release("r")
    return statistics.median(times) * 1000


@torch.inference_mode()
def generate_ms(model: Any, ids: torch.Tensor, steps: int) -> float:
    generate: Any = model.generate
    one = time.perf_counter()
    generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, min_new_tokens=1, do_sample=False)
    one = time.perf_counter() - one  # the prefill and the call's own overhead
    started = time.perf_counter()
    generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False)
    return (time.perf_counter() - started - one) / steps * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="", help="comma-separated thread counts (default: 1 and every core)")
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    runner = SpokenAnswerRunner(model, tokenizer)
    ids = torch.tensor([chat_prompt_ids(tokenizer, MESSAGES)])
    head = model.get_output_embeddings().weight.detach()
    hidden = torch.randn(1, head.shape[1])
    cores = len(os.sched_getaffinity(0))
    thread_counts = sorted({int(t) for t in args.threads.split(",") if t.strip()} or {1, cores})
    rows: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for threads in thread_counts:
            torch.set_num_threads(threads)
            measured = {
                "copy of every weight": weights_ms(model),
                "lm_head alone": per_step(lambda: torch.nn.functional.linear(hidden, head), 20),
                "forward (KV cache)": forward_ms(model, ids, args.tokens),
                "runner.decode": runner_ms(runner, args.tokens),
                "generate": generate_ms(model, ids, args.tokens),
            }
            for name, value in measured.items():
                rows.setdefault((name, threads), []).append(value)
    params = sum(p.numel() for p in model.parameters())
    table = Table(title=f"SmolLM2-135M-Instruct float32 ({params / 1e6:.0f} M parameters, {params * 4 / 1e6:.0f} MB): ms per token, medians of {args.rounds}")
    table.add_column("step")
    for threads in thread_counts:
        table.add_column(f"{threads} thread{'s' if threads > 1 else ''}", justify="right")
    for name in dict.fromkeys(name for name, _ in rows):
        table.add_row(name, *(f"{statistics.median(rows[name, t]):.1f}" for t in thread_counts))
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
