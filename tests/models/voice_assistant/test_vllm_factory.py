"""The thinker's ``engine`` switch: checked before anything loads; without vLLM, engine: vllm is one clear
error and engine: auto (the shipped default) runs on hf."""

from __future__ import annotations

import sys

import pytest

from omnictl.exceptions import StartupError
from omnictl.models.voice_assistant import stages


def test_an_unknown_engine_is_named() -> None:
    with pytest.raises(ValueError, match=r"factory_args.engine: must be one of auto, hf, vllm, got 'vllm-gpu'"):
        stages.thinker(engine="vllm-gpu")


def test_engine_options_on_the_hf_engine_are_refused() -> None:
    with pytest.raises(ValueError, match=r"factory_args.vllm: engine options apply to engine: vllm or auto only"):
        stages.thinker(engine="hf", vllm={"max_num_seqs": 8})


def test_engine_vllm_without_vllm_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(StartupError, match=r"pip install 'omnictl\[vllm\]'.*or set factory_args.engine: hf"):
        stages.thinker(engine="vllm")


def test_engine_auto_without_vllm_runs_on_hf_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

    monkeypatch.setitem(sys.modules, "vllm", None)
    with caplog.at_level("INFO", logger="omnictl.models.voice_assistant.stages"):
        scheduler = stages.thinker(engine="auto", vllm={"max_num_seqs": 8})  # options for vLLM, unused here
    assert isinstance(scheduler, AutoregressiveScheduler)
    assert "engine auto -> hf" in caplog.text and "omnictl[vllm]" in caplog.text


def test_engine_auto_with_vllm_is_the_vllm_engine() -> None:
    pytest.importorskip("vllm")
    from omnictl.schedulers.vllm_engine import VllmScheduler

    scheduler = stages.thinker(engine="auto", vllm={"max_num_seqs": 8})  # built, not started: no engine yet
    assert isinstance(scheduler, VllmScheduler) and scheduler.options.max_num_seqs == 8


def test_engine_vllm_refuses_the_penalties_it_cannot_apply_the_same_way() -> None:
    pytest.importorskip("vllm")
    with pytest.raises(ValueError, match=r"repetition_penalty: engine vllm supports 1.0 \(off\) only, got 1.2"):
        stages.thinker(engine="vllm", repetition_penalty=1.2)
    with pytest.raises(ValueError, match=r"no_repeat_ngram: engine vllm supports 0 \(off\) only, got 3"):
        stages.thinker(engine="vllm", no_repeat_ngram=3)
    with pytest.raises(ValueError, match=r"factory_args.vllm.max_num_seq: unknown engine option"):
        stages.thinker(engine="vllm", vllm={"max_num_seq": 8})


def test_on_the_cpu_the_vllm_thinker_caches_the_conversation_in_blocks_of_32_tokens() -> None:
    """Prefix caching reuses whole KV blocks; a voice turn adds ~30 tokens, so vLLM's CPU
    default of 128 reused nothing of most turns' conversation (benchmarks/turn_prefill.py)."""
    pytest.importorskip("vllm")
    scheduler = stages.thinker(engine="vllm")  # built, not started: no engine yet
    assert scheduler.options.block_size == 32 and scheduler.options.prefix_caching  # type: ignore[attr-defined]
    assert scheduler.options.engine_args("m").block_size == 32  # type: ignore[attr-defined]
    given = stages.thinker(engine="vllm", vllm={"block_size": 128})
    assert given.options.block_size == 128  # type: ignore[attr-defined]
