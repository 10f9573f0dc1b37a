"""The staged Qwen3-Omni pipeline against monolithic transformers ``generate``, side by side.

Same tiny random-weight checkpoint (written to a temporary directory unless
``--model-path`` names one), same greedy text-only requests, same text and audio
lengths (``--max-tokens`` text tokens, ``--max-codes`` codec frames: a random talker
rarely says end-of-speech, so both sides are capped alike).

- staged: ``topologies/qwen3-omni.yaml`` launched with ``device="cpu"`` (real stage
  processes, ZeroMQ, shared memory), closed loop with ``c`` clients;
- monolithic: ``Qwen3OmniMoeForConditionalGeneration.generate`` on batches of ``c``
  requests (its best case: one padded batch per ``c`` requests); it returns text and
  audio only when the whole batch is done, so its first text and first audio are its
  batch latency.

Reported per concurrency 1, 8, 16: requests/s, time to first text, time to first audio
(p50), and request latency (p50). Goals, reported not asserted: staged >= 5x the
monolithic requests/s at concurrency 16; staged first audio within a third of the
monolithic request's total latency.

Run: ``python benchmarks/vs_transformers.py [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

TOPOLOGY = REPO / "topologies" / "qwen3-omni.yaml"
QUESTIONS = (
    "What is the capital of France?",
    "Hello, how are you today?",
    "Describe the quick brown fox.",
    "yes no maybe",
    "Listen to this audio and answer the question. What is the capital of France?",
    "Thanks, goodbye.",
)


@dataclass
class Figures:
    requests_per_s: float
    first_text_p50: float
    first_audio_p50: float
    latency_p50: float


def make_request(index: int, max_tokens: int) -> dict[str, Any]:
    question = QUESTIONS[index % len(QUESTIONS)]
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": question}]},
        ],
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
    }


# --- staged ---------------------------------------------------------------------------


def staged_topology(max_codes: int, stream_every: int, chunk_frames: int, one_gpu: bool = False) -> Any:
    """The shipped topology with the knobs of this run as factory_args (``one_gpu``: the
    talker's process on GPU 0 too, for a machine with one)."""
    from omnictl.topology.validation import loads

    text = TOPOLOGY.read_text()
    if one_gpu:
        text = text.replace("gpu: 1\n", "gpu: 0\n")
    knobs = {
        "talker_ar": f"{{max_codes: {max_codes}}}",
        "thinker": f"{{stream_every: {stream_every}}}",
        "code2wav": f"{{chunk_frames: {chunk_frames}}}",
    }
    for stage, args in knobs.items():
        factory = f"factory: omnictl.models.qwen3_omni.stages.{stage}\n"
        if factory not in text:
            raise ValueError(f"{TOPOLOGY}: no stage with {factory.strip()!r}")
        text = text.replace(factory, factory + f"    factory_args: {args}\n")
    return loads(text, str(TOPOLOGY))


async def staged_one(pipe: Any, inputs: dict[str, Any]) -> tuple[float, float, float]:
    started = time.perf_counter()
    first_text = first_audio = None
    req = await pipe.submit(inputs)
    async for event in req.events():
        now = time.perf_counter() - started
        if event.kind == "stream" and event.stage == "decode" and first_text is None:
            first_text = now
        if event.kind == "stream" and event.stage == "code2wav" and first_audio is None:
            first_audio = now
        if event.kind == "error":
            raise RuntimeError(f"staged request failed: {event.error}")
    await req.result()
    total = time.perf_counter() - started
    return first_text or total, first_audio or total, total


async def staged_run(
    model_path: str, levels: list[int], rounds: int, max_tokens: int, max_codes: int, knobs: dict[str, int]
) -> dict[int, Figures]:
    import omnictl

    figures: dict[int, Figures] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        async with omnictl.Pipeline.launch(
            staged_topology(max_codes, **knobs), model_path=model_path, device="cpu", run_dir=run_dir, profile=False
        ) as pipe:
            await staged_one(pipe, make_request(0, max_tokens))  # warm-up
            for level in levels:
                total = level * rounds
                counter = iter(range(total))
                samples: list[tuple[float, float, float]] = []

                async def client() -> None:
                    for index in counter:
                        samples.append(await staged_one(pipe, make_request(index, max_tokens)))

                started = time.perf_counter()
                await asyncio.gather(*(client() for _ in range(level)))
                wall = time.perf_counter() - started
                figures[level] = Figures(
                    total / wall,
                    statistics.median(s[0] for s in samples),
                    statistics.median(s[1] for s in samples),
                    statistics.median(s[2] for s in samples),
                )
    return figures


# --- monolithic -----------------------------------------------------------------------


class Monolithic:
    """``Qwen3OmniMoeForConditionalGeneration.generate`` on one padded batch of requests at a
    time: text and audio come back only when the whole batch is done."""

    def __init__(self, model_path: str, max_tokens: int, max_codes: int, device: str = "cpu") -> None:
        import torch
        from transformers import Qwen3OmniMoeForConditionalGeneration

        from omnictl.models.qwen3_omni.processor import load_processor

        self.processor = load_processor(model_path)
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_path, dtype=torch.float32)
        self.model = self.model.to(device).eval()
        self.device = device
        self.max_tokens = max_tokens
        self.max_codes = max_codes

    def generate(self, indices: list[int]) -> float:
        """Run the requests ``indices`` (see :func:`make_request`) as one batch; seconds taken."""
        import torch

        prompts = [
            self.processor.apply_chat_template(make_request(i, self.max_tokens)["messages"], add_generation_prompt=True,
                                               tokenize=False)
            for i in indices
        ]
        inputs = self.processor(text=prompts, return_tensors="pt", padding=True).to(self.device)
        started = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                **inputs,
                thinker_max_new_tokens=self.max_tokens,
                thinker_do_sample=False,
                thinker_eos_token_id=self.model.config.im_end_token_id,
                talker_max_new_tokens=self.max_codes,
                talker_do_sample=False,
            )
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - started


def monolithic_run(model_path: str, levels: list[int], rounds: int, max_tokens: int, max_codes: int) -> dict[int, Figures]:
    mono = Monolithic(model_path, max_tokens, max_codes)
    mono.generate([0])  # warm-up
    figures: dict[int, Figures] = {}
    for level in levels:
        latencies: list[float] = []
        started = time.perf_counter()
        for round_index in range(rounds):
            seconds = mono.generate(list(range(round_index * level, (round_index + 1) * level)))
            latencies.extend([seconds] * level)
        wall = time.perf_counter() - started
        p50 = statistics.median(latencies)
        figures[level] = Figures(level * rounds / wall, p50, p50, p50)
    return figures


# --- report ---------------------------------------------------------------------------


def report(staged: dict[int, Figures], mono: dict[int, Figures]) -> None:
    print(f"{'conc':>4} | {'side':<10} | {'req/s':>7} | {'1st text p50':>12} | {'1st audio p50':>13} | {'latency p50':>11}")
    for level in staged:
        for name, figures in (("staged", staged[level]), ("monolithic", mono[level])):
            print(
                f"{level:>4} | {name:<10} | {figures.requests_per_s:7.2f} | {figures.first_text_p50 * 1000:10.0f}ms"
                f" | {figures.first_audio_p50 * 1000:11.0f}ms | {figures.latency_p50 * 1000:9.0f}ms"
            )
    top = max(staged)
    speedup = staged[top].requests_per_s / mono[top].requests_per_s
    print(f"goal: staged >= 5x monolithic req/s at concurrency {top}: {speedup:.2f}x -> {'met' if speedup >= 5 else 'NOT met'}")
    ratio = staged[1].first_audio_p50 / mono[1].latency_p50
    print(
        f"goal: staged first audio <= 1/3 of the monolithic request latency (concurrency 1): "
        f"{ratio:.2f} -> {'met' if ratio <= 1 / 3 else 'NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", help="a Qwen3-Omni checkpoint directory (default: write a tiny one)")
    parser.add_argument("--max-tokens", type=int, default=24, help="text tokens per request")
    parser.add_argument("--max-codes", type=int, default=32, help="codec frames per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency")
    parser.add_argument("--stream-every", type=int, default=1, help="thinker: stream every N tokens")
    parser.add_argument("--chunk-frames", type=int, default=10, help="code2wav: frames per audio chunk")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 4, one round (a smoke run)")
    args = parser.parse_args(argv)
    levels = [1, 4] if args.quick else [1, 8, 16]
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as scratch:
        model_path = args.model_path
        if model_path is None:
            from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint

            model_path = str(write_tiny_checkpoint(Path(scratch) / "tiny-qwen3-omni"))
        print(
            f"checkpoint: {model_path}; {args.max_tokens} text tokens, {args.max_codes} codec frames per request; "
            f"thinker streams every {args.stream_every} token(s), code2wav chunks of {args.chunk_frames} frames"
        )
        mono = monolithic_run(model_path, levels, rounds, args.max_tokens, args.max_codes)
        knobs = {"stream_every": args.stream_every, "chunk_frames": args.chunk_frames}
        staged = asyncio.run(staged_run(model_path, levels, rounds, args.max_tokens, args.max_codes, knobs))
    report(staged, mono)
    return 0


if __name__ == "__main__":
    sys.exit(main())
