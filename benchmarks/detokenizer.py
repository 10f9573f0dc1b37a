"""The text path's cost per token as an answer grows: 10, 100 and 1,000 tokens, in one run.

What the HF and vLLM schedulers both do with each generated token
(:class:`omnictl.schedulers.detokenizer.TextGeneration`: decode it, look for a stop string,
work out what is safe to stream, take the chunk), on SmolLM2-135M-Instruct's tokenizer (the
voice assistant's thinker), for an answer with a stop string that never comes ("User:", so
the stop-string search and the held-back tail run on every token). Side by side:

- **stream**: the ``tokenizers`` streaming decoder (:class:`~omnictl.schedulers.detokenizer.StreamDecoder`),
  what every runner with a fast tokenizer gets;
- **whole**: every token so far decoded again on each step
  (:class:`~omnictl.schedulers.detokenizer.WholeDecoder`), how both paths made text before.

Each figure is the median time of one token at that position of the answer (the last ten
tokens of an answer that long, over ``--rounds`` answers), in microseconds.

Goal: **stream**'s cost per token at token 1,000 is within 1.5x of its cost at token 10
(it does not grow with the answer).

Run: ``python benchmarks/detokenizer.py [--quick] [--rounds 30]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import datetime, timezone
from typing import Any, Callable

from omnictl.schedulers.detokenizer import StreamDecoder, TextDecoder, TextGeneration, WholeDecoder
from omnictl.schedulers.sampling import SamplingParams

LENGTHS = (10, 100, 1000)
TIMED = 10  # the last this many tokens of each answer are timed
GOAL_RATIO = 1.5
PARAGRAPH = (
    "The river runs past the old mill, where the miller's daughter counts sacks of flour "
    "and sings about the weather. In winter the wheel freezes; in spring it turns again, "
    "and the village café opens its doors — naïve tourists ask for crème brûlée. "
)


def answer_tokens(tokenizer: Any, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        ids.extend(tokenizer(PARAGRAPH, add_special_tokens=False)["input_ids"])
    return ids[:count]


def per_token_us(make_decoder: Callable[[], TextDecoder], tokens: list[int], rounds: int) -> float:
    """Median microseconds per token over the last TIMED tokens of ``tokens``."""
    samples = []
    params = SamplingParams(max_tokens=len(tokens) + 1, stop=("User:",))
    for _ in range(rounds):
        generation = TextGeneration(params, make_decoder(), {-1})
        for token in tokens[:-TIMED]:
            generation.add(token)
            generation.chunk()
        started = time.perf_counter()
        for token in tokens[-TIMED:]:
            generation.add(token)
            generation.chunk()
        samples.append((time.perf_counter() - started) / TIMED)
        assert generation.finish_reason is None, "the answer ended early: the benchmark measures nothing"
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="answers timed per figure (median)")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds

    from transformers import AutoTokenizer

    from omnictl.models.voice_assistant.llm import smollm2_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint(), local_files_only=True)
    backend = tokenizer.backend_tokenizer

    def detokenize(token_ids: Any) -> str:
        return str(tokenizer.decode(list(token_ids), skip_special_tokens=True))

    decoders: dict[str, Callable[[], TextDecoder]] = {
        "stream": lambda: StreamDecoder(backend),
        "whole": lambda: WholeDecoder(detokenize),
    }
    print(
        f"SmolLM2-135M-Instruct tokenizer; {rounds} rounds; "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'µs per token at token':<24}" + "".join(f"{length:>10,}" for length in LENGTHS))
    figures: dict[str, list[float]] = {}
    for name, make in decoders.items():
        figures[name] = [per_token_us(make, answer_tokens(tokenizer, length), rounds) for length in LENGTHS]
        print(f"{name:<24}" + "".join(f"{value:>10.1f}" for value in figures[name]))
    first, last = figures["stream"][0], figures["stream"][-1]
    ratio = last / first
    verdict = "met" if ratio <= GOAL_RATIO else "not met"
    print(
        f"goal: stream's cost per token at token {LENGTHS[-1]:,} within {GOAL_RATIO}x of token {LENGTHS[0]}: "
        f"{ratio:.2f}x ({last:.1f} vs {first:.1f} µs) — {verdict}"
    )
    print(f"whole at token {LENGTHS[-1]:,} costs {figures['whole'][-1] / last:.0f}x stream's")


if __name__ == "__main__":
    main()
