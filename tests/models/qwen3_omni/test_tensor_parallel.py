"""The tiny Qwen3-Omni thinker on the HF runner at tp_size 2 (two CPU ranks over gloo, its
MoE text model sharded with transformers' tp plan) answers token for token as at tp_size 1,
in one pipeline: mm_aggregate feeds both thinkers, each with its own decode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

import omnictl
from tests.models.qwen3_omni.conftest import request

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[3]


def topology(tmp_path: Path) -> Path:
    shipped = yaml.safe_load((REPO / "topologies" / "qwen3-omni.yaml").read_text())
    stages = {s["name"]: s for s in shipped["stages"]}
    front = [stages[n] for n in ("preprocessing", "image_encoder", "audio_encoder", "mm_aggregate")]
    front[-1]["next"] = ["thinker", "thinker_tp"]
    thinker = {"factory": stages["thinker"]["factory"]}
    decode = {"factory": stages["decode"]["factory"], "terminal": True, "process": "frontend"}
    listed = [
        *front,
        # TP=1 beside the frontend (one process fewer to start); TP=2 owns its process.
        {"name": "thinker", **thinker, "process": "frontend", "next": ["decode"]},
        {"name": "thinker_tp", **thinker, "tp_size": 2, "next": ["decode_tp"]},
        {"name": "decode", **decode, "modality": "text"},
        {"name": "decode_tp", **decode, "modality": "text_tp"},
    ]
    path = tmp_path / "qwen3-tp.yaml"
    path.write_text(yaml.safe_dump({"name": "qwen3-tp", "stages": listed}, sort_keys=False))
    return path


def test_tiny_thinker_at_tp2_answers_as_at_tp1(tiny_qwen: Path, tmp_path: Path) -> None:
    questions = ["What is the capital of France?", "Name three colours.", "Why is the sky blue?"]

    async def run() -> tuple[list[dict], dict]:
        async with omnictl.Pipeline.launch(topology(tmp_path), model_path=str(tiny_qwen), device="cpu") as pipe:
            handles = [await pipe.submit(request("text", max_tokens=16, question=q)) for q in questions]
            results = list(await asyncio.gather(*(h.result() for h in handles)))
            image = await (await pipe.submit(request("image", max_tokens=8))).result()  # deepstack on both ranks
            stats = await pipe.stats()
            return [*results, image], stats

    results, stats = asyncio.run(run())
    for result in results:
        assert result["decode"].completion_tokens > 0
        assert (result["decode_tp"].text, result["decode_tp"].completion_tokens) == (
            result["decode"].text,
            result["decode"].completion_tokens,
        )
    assert len({r["decode"].text for r in results}) > 1  # the answers depend on the question
    # Every request ended: no KV cache left on the follower either.
    assert stats["thinker_tp"]["kv_slots"] == 0 and stats["thinker_tp"]["rank_kv_slots"] == [0]
