"""The vLLM stage's engine knobs are validated, naming the key; a machine without vLLM gets one clear error."""

from __future__ import annotations

import sys

import pytest

from omnictl.exceptions import StartupError
from omnictl.schedulers.vllm_engine import VllmOptions, require_vllm


def test_defaults_fit_a_small_cpu_machine() -> None:
    options = VllmOptions.from_mapping(None)
    assert options == VllmOptions()
    assert (options.kv_cache_gib, options.max_num_seqs, options.max_model_len) == (1, 32, 2048)
    assert options.enforce_eager and options.prefix_caching and options.dtype == "float32"


def test_given_knobs_are_kept() -> None:
    options = VllmOptions.from_mapping({"kv_cache_gib": 2, "max_num_seqs": 8, "max_model_len": 512,
                                        "enforce_eager": False, "dtype": "bfloat16"})
    assert (options.kv_cache_gib, options.max_num_seqs, options.max_model_len) == (2, 8, 512)
    assert not options.enforce_eager and options.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kv_cache": 1}, r"factory_args.vllm.kv_cache: unknown engine option \(known: .*kv_cache_gib"),
        ({"kv_cache_gib": 0}, r"kv_cache_gib: must be an integer >= 1, got 0"),
        ({"kv_cache_gib": 0.5}, r"kv_cache_gib: must be an integer >= 1, got 0.5"),
        ({"max_num_seqs": True}, r"max_num_seqs: must be an integer >= 1, got True"),
        ({"max_model_len": 8}, r"max_model_len: must be at least 16 tokens, got 8"),
        ({"enforce_eager": "yes"}, r"enforce_eager: must be true or false, got 'yes'"),
        ({"dtype": "float64"}, r"dtype: must be one of float32, bfloat16, float16, got 'float64'"),
        ({"device": "tpu"}, r"device: must be 'cpu' or 'cuda', got 'tpu'"),
        ({"block_size": 0}, r"block_size: must be an integer >= 1 or null \(vLLM's default\), got 0"),
        ({"block_size": "32"}, r"block_size: must be an integer >= 1 or null \(vLLM's default\), got '32'"),
        ([1, 2], r"factory_args.vllm: expected a mapping of engine options, got list"),
    ],
)
def test_a_bad_knob_is_named(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VllmOptions.from_mapping(raw)  # type: ignore[arg-type]


def test_without_vllm_installed_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` does where it is not installed
    with pytest.raises(StartupError, match=r"engine is 'vllm' but vLLM is not installed .*pip install 'omnictl\[vllm\]'"):
        require_vllm()


def test_an_unknown_knob_lists_every_known_one() -> None:
    with pytest.raises(ValueError) as caught:
        VllmOptions.from_mapping({"kv": 1, "zz": 2})
    assert str(caught.value) == (
        "factory_args.vllm.kv: unknown engine option (known: block_size, device, dtype, enforce_eager, kv_cache_gib, "
        "max_model_len, max_num_seqs, prefix_caching, tensor_parallel_size)")


def test_check_names_the_knob_under_factory_args_by_default_and_accepts_the_edges() -> None:
    with pytest.raises(ValueError) as caught:
        VllmOptions(max_num_seqs=0).check()
    assert str(caught.value) == "factory_args.vllm.max_num_seqs: must be an integer >= 1, got 0"
    with pytest.raises(ValueError, match="^talker.max_model_len: must be at least 16 tokens, got 15$"):
        VllmOptions(max_model_len=15).check("talker")
    VllmOptions(max_model_len=16, device="cuda", dtype="float16").check()  # the smallest length, a GPU


def test_a_bad_value_is_named_where_the_caller_says() -> None:
    with pytest.raises(ValueError, match="^talker.vllm.max_num_seqs: must be an integer >= 1, got 0$"):
        VllmOptions.from_mapping({"max_num_seqs": 0}, where="talker.vllm")
