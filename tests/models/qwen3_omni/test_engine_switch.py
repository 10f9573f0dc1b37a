"""The Qwen3-Omni thinker's ``engine`` switch, checked before anything loads."""

from __future__ import annotations

import sys

import pytest

from omnictl.exceptions import StartupError
from omnictl.models.qwen3_omni import stages


def test_an_unknown_engine_is_named() -> None:
    with pytest.raises(ValueError, match=r"factory_args.engine: must be 'hf' or 'vllm', got 'auto'"):
        stages.thinker("/nonexistent", engine="auto")


def test_engine_options_on_the_hf_engine_are_refused() -> None:
    with pytest.raises(ValueError, match=r"factory_args.vllm: engine options apply to engine: vllm only"):
        stages.thinker("/nonexistent", engine="hf", vllm={"max_num_seqs": 8})


def test_engine_vllm_without_vllm_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(StartupError, match=r"pip install 'omnictl\[vllm\]'.*or set factory_args.engine: hf"):
        stages.thinker("/nonexistent", engine="vllm")


def test_a_bad_engine_option_is_named_before_the_checkpoint_is_read() -> None:
    pytest.importorskip("vllm")
    with pytest.raises(ValueError, match=r"factory_args.vllm.max_model_len: must be an integer >= 1, got 0"):
        stages.thinker("/nonexistent", engine="vllm", vllm={"max_model_len": 0})
