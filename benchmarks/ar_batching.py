"""Continuous batching in the autoregressive scheduler, against one-at-a-time `generate`.

A random-weight Llama (no download) serves N greedy requests of different prompt
lengths. Figures, side by side in one run:

- ``generate``: transformers ``model.generate`` per request, one after another (the
  monolithic floor a batching scheduler must beat);
- ``scheduler cN``: :class:`AutoregressiveScheduler` over :class:`HFCausalLMRunner`,
  with N requests in flight at a time (new ones join between decode steps).

Printed per row: requests/s, generated tokens/s, mean time to first token, and
speed-up over ``generate``. Also checks that each request's tokens equal the
``generate`` tokens (batching must not change greedy output).

One torch thread by default: on a shared machine, spinning OpenMP threads make every
small op slow and the figures wander (``--threads 0`` for torch's default).

Run: ``python benchmarks/ar_batching.py [--requests 32] [--max-tokens 32] [--hidden 256] [--layers 4] [--threads 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


def build_model(hidden: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 128, 1),
        max_position_embeddings=4096,
        bos_token_id=None,
        pad_token_id=None,
        eos_token_id=None,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config).eval()


def prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 4096, (8 + (index * 7) % 40,), generator=generator).tolist() for index in range(count)]


def run_generate(model: LlamaForCausalLM, work: list[list[int]], max_tokens: int) -> tuple[float, list[float], list[list[int]]]:
    outputs, first_token = [], []
    with torch.inference_mode():
        model.generate(torch.tensor([work[0]]), max_new_tokens=2, do_sample=False)  # warm-up, not timed
    started = time.perf_counter()
    with torch.inference_mode():
        for ids in work:
            begin = time.perf_counter()
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            # generate gives nothing before the end: a client's first token comes with the last.
            first_token.append(time.perf_counter() - begin)
            outputs.append(out[0, len(ids) :].tolist())
    return time.perf_counter() - started, first_token, outputs


async def run_scheduler(
    model: LlamaForCausalLM, work: list[list[int]], max_tokens: int, concurrency: int
) -> tuple[float, list[float], list[list[int]]]:
    scheduler = AutoregressiveScheduler(HFCausalLMRunner(model), max_batch=concurrency)
    await scheduler.start()
    submitted: dict[str, float] = {}
    first_token: dict[str, float] = {}
    results: dict[str, list[int]] = {}
    next_index = 0

    def submit() -> None:
        nonlocal next_index
        rid = f"r{next_index}"
        submitted[rid] = time.perf_counter()
        sampling = {"max_tokens": max_tokens, "temperature": 0}
        scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, rid, {"input_ids": work[next_index]}, params={"sampling": sampling}))
        next_index += 1

    started = time.perf_counter()
    try:
        while next_index < min(concurrency, len(work)):
            submit()
        while len(results) < len(work):
            message = await scheduler.outbox.get()
            if message.kind is OutgoingKind.ERROR:
                raise RuntimeError(message.error)
            first_token.setdefault(message.request_id, time.perf_counter() - submitted[message.request_id])
            if message.kind is OutgoingKind.RESULT:
                results[message.request_id] = message.data.token_ids
                if next_index < len(work):
                    submit()
        elapsed = time.perf_counter() - started
    finally:
        await scheduler.stop()
    return elapsed, list(first_token.values()), [results[f"r{index}"] for index in range(len(work))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        # On a loaded machine, spinning OpenMP threads make every small op slow; one thread is steadier.
        torch.set_num_threads(args.threads)

    model = build_model(args.hidden, args.layers)
    work = prompts(args.requests)
    tokens = args.requests * args.max_tokens
    print(f"model: Llama hidden={args.hidden} layers={args.layers} (random weights), torch threads={torch.get_num_threads()}")
    print(f"{args.requests} requests, prompts 8-47 tokens, {args.max_tokens} greedy tokens each\n")
    print(f"{'mode':<14}{'req/s':>9}{'tok/s':>9}{'TTFT mean':>12}{'speed-up':>10}  same tokens")

    base_seconds, base_ttft, reference = run_generate(model, work, args.max_tokens)
    print(f"{'generate':<14}{args.requests / base_seconds:>9.2f}{tokens / base_seconds:>9.0f}{statistics.mean(base_ttft) * 1000:>10.0f}ms{1.0:>9.1f}x  -")
    for concurrency in (1, 8, 16):
        seconds, ttft, outputs = asyncio.run(run_scheduler(model, work, args.max_tokens, concurrency))
        same = sum(out == ref for out, ref in zip(outputs, reference))
        print(
            f"{f'scheduler c{concurrency}':<14}{args.requests / seconds:>9.2f}{tokens / seconds:>9.0f}"
            f"{statistics.mean(ttft) * 1000:>10.0f}ms{base_seconds / seconds:>9.1f}x  {same}/{len(work)}"
        )


if __name__ == "__main__":
    main()
