"""SmolLM2 from the packaged GGUF: converted once, cached, and it knows where Paris is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnictl.models.voice_assistant import llm, stages
from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.schedulers.base import IncomingKind, OutgoingKind

from .conftest import incoming, run, until_result

pytestmark = pytest.mark.slow  # the real SmolLM2 (its first use converts the GGUF: minutes)


def test_conversion_is_cached_and_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = llm.smollm2_checkpoint()  # converts on the very first run on this machine
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns

    def must_not_convert(gguf: Path, out_dir: Path) -> None:
        raise AssertionError("converted again although the cache is complete")

    monkeypatch.setattr(llm, "convert_gguf", must_not_convert)
    assert llm.smollm2_checkpoint() == folder
    assert weights.stat().st_mtime_ns == before
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_a_cache_from_another_package_version_is_converted_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / llm.CHECKPOINT_NAME
    stale.mkdir()
    (stale / "omnictl-source.json").write_text(json.dumps({"gguf": "elsewhere", "size": 1}))
    calls: list[Path] = []

    def pretend_conversion(gguf: Path, out_dir: Path) -> None:  # the 20 s conversion is covered above
        calls.append(gguf)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(llm, "convert_gguf", pretend_conversion)
    assert llm.smollm2_checkpoint(tmp_path) == stale
    assert calls == [llm.gguf_path()]
    assert (stale / "config.json").read_text() == "{}"
    assert llm.smollm2_checkpoint(tmp_path) == stale and len(calls) == 1  # and then reused


def test_smollm2_answers_the_paris_question_greedily_in_the_thinker_stage() -> None:
    # The HF runner, pinned: with the vllm extra installed, engine auto would start a vLLM
    # engine here (~25 s) for what tests/models/voice_assistant/test_vllm_thinker.py checks
    # on its one engine (greedy Paris, deltas adding up to the result, nothing left held).
    async def main() -> None:
        scheduler = stages.thinker(engine="hf", max_tokens=24)
        await scheduler.start()
        try:
            question = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "q", question, sampling={"temperature": 0}))
            streamed, result = await until_result(scheduler, "q")
            assert result.kind is OutgoingKind.RESULT, result.error
            assert isinstance(result.data, TokenResult)
            assert all(isinstance(m.data, TokenDelta) for m in streamed)
            assert "Paris" in result.data.text
            assert "".join(m.data.text for m in streamed) == result.data.text  # streamed as it was written
            assert result.data.prompt_tokens > 5 and result.data.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert scheduler.load().kv_slots == 0
        finally:
            await scheduler.stop()

    run(main())


def test_threads_zero_means_every_core_and_none_leaves_them() -> None:
    import os

    import torch

    from omnictl.models.voice_assistant.llm import set_threads

    before = torch.get_num_threads()
    try:
        assert set_threads(0) == len(os.sched_getaffinity(0))
        assert set_threads(1) == 1
        assert set_threads(None) == 1
        with pytest.raises(ValueError, match="threads: must be >= 0"):
            set_threads(-2)
    finally:
        torch.set_num_threads(before)
