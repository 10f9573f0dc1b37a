"""A long prompt next to a running answer: prefill whole against prefill in chunks.

The embedded SmolLM2-135M-Instruct in the autoregressive scheduler, on the CPU. A short
request ("chat") decodes; then a ~6,000-token prompt ("long", under the 8,192 context)
arrives. Measured, with ``prefill_chunk`` 512 (the default) and with the prefill whole
(``prefill_chunk`` larger than the prompt), in one run:

- the longest gap between two of chat's tokens while long's prompt goes in (whole: the
  entire prefill; chunked: about one chunk plus a decode step);
- how long an abort of long, sent 1 s into its prefill, takes to free its KV cache;
- long's time to first token when it is not aborted.

Run: ``python benchmarks/long_prefill.py [--tokens 6000] [--chunk 512]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.voice_assistant.llm import load_smollm2
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


@dataclass
class Figures:
    label: str
    max_gap_s: float = 0.0
    abort_s: float = 0.0
    first_token_s: float = 0.0


def _request(rid: str, ids: list[int], max_tokens: int) -> IncomingMessage:
    return IncomingMessage(IncomingKind.NEW_REQUEST, rid, {"input_ids": ids},
                           params={"sampling": {"max_tokens": max_tokens, "temperature": 0}})


async def _measure(runner: HFCausalLMRunner, chunk: int, long_ids: list[int], label: str) -> Figures:
    figures = Figures(label)
    scheduler = AutoregressiveScheduler(runner, prefill_chunk=chunk)
    await scheduler.start()
    try:
        # 1. chat decodes while long prefills: the longest gap between chat's tokens.
        scheduler.inbox.put_nowait(_request("chat", [1, 2, 3, 4], 10_000))
        stamps: list[float] = []
        while len(stamps) < 3:
            message = await scheduler.outbox.get()
            stamps.append(time.perf_counter())
        arrived = time.perf_counter()
        scheduler.inbox.put_nowait(_request("long", long_ids, 1))
        while True:
            message = await scheduler.outbox.get()
            if message.request_id == "chat":
                stamps.append(time.perf_counter())
            elif message.kind is OutgoingKind.RESULT:
                figures.first_token_s = time.perf_counter() - arrived
                break
        while (await scheduler.outbox.get()).request_id != "chat":
            pass
        stamps.append(time.perf_counter())  # chat's first token after long's prompt is in
        gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b > arrived]
        figures.max_gap_s = max(gaps)
        scheduler.abort("chat")
        # 2. an abort of a long prefill, 1 s in.
        scheduler.inbox.put_nowait(_request("long-2", long_ids, 1))
        await asyncio.sleep(1.0)
        aborted = time.perf_counter()
        scheduler.abort("long-2")
        while runner.kv_slots() or scheduler.load().running:
            await asyncio.sleep(0.005)
        figures.abort_s = time.perf_counter() - aborted
    finally:
        await scheduler.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=6000)
    parser.add_argument("--chunk", type=int, default=512)
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(args.tokens))
    long_ids: list[Any] = tokenizer(text)["input_ids"][: args.tokens]
    runner = HFCausalLMRunner(model, tokenizer)
    results = [asyncio.run(_measure(runner, args.chunk, long_ids, f"chunked ({args.chunk} tokens)")),
               asyncio.run(_measure(runner, 10 * args.tokens, long_ids, "whole"))]
    table = Table(title=f"a {len(long_ids)}-token prompt next to a decoding request (SmolLM2-135M, CPU)")
    for column in ("prefill", "longest gap in the other's tokens s", "abort 1 s in takes s", "long's first token s"):
        table.add_column(column, justify="right")
    for row in results:
        table.add_row(row.label, f"{row.max_gap_s:.2f}", f"{row.abort_s:.2f}", f"{row.first_token_s:.2f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
