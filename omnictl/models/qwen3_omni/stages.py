"""Stage factories for the Qwen3-Omni topologies (``topologies/qwen3-omni*.yaml``).

Each factory takes ``model_path`` (a local checkpoint directory; nothing is
downloaded) and ``device``, and returns a plain function (preprocessing, encoders,
aggregation) or a scheduler (thinker, decode, talker, code2wav).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import msgspec

from omnictl.inputs import ChatRequest
from omnictl.models.qwen3_omni.code2wav import Code2WavScheduler, Vocoder
from omnictl.models.qwen3_omni.decode import DecodeScheduler
from omnictl.models.qwen3_omni.multimodal import Aggregator, AudioEncoder, ImageEncoder, Preprocessor
from omnictl.models.qwen3_omni.multimodal import merge_multimodal as _merge_multimodal
from omnictl.models.qwen3_omni.payloads import ThinkerResult
from omnictl.models.qwen3_omni.talker import TalkerRunner
from omnictl.models.qwen3_omni.talker_scheduler import TalkerScheduler
from omnictl.models.qwen3_omni.thinker import ThinkerRunner, ThinkerScheduler
from omnictl.outputs import TokenResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S
from omnictl.schedulers.base import Scheduler

StageFn = Callable[[Mapping[str, Any]], dict[str, Any]]

# transformers' defaults for the talker in `Qwen3OmniMoeForConditionalGeneration.generate`.
TALKER_SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "max_tokens": 4096}


def preprocessing(model_path: str | Path | None = None) -> Callable[[ChatRequest | Mapping[str, Any]], dict[str, Any]]:
    """The entry stage: takes the typed request (HTTP) or the request dict (Python API)."""
    return Preprocessor(model_path)


def audio_encoder(model_path: str | Path | None = None, device: str | None = None) -> StageFn:
    return AudioEncoder(model_path, device)


def image_encoder(model_path: str | Path | None = None, device: str | None = None) -> StageFn:
    return ImageEncoder(model_path, device)


def mm_aggregate(model_path: str | Path | None = None, device: str | None = None) -> StageFn:
    return Aggregator(model_path, device)


def merge_multimodal(inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return _merge_multimodal(inputs)


def thinker(
    model_path: str | Path | None = None,
    device: str | None = None,
    stream_every: int = 1,
    max_batch: int = 32,
    engine: str = "hf",
    vllm: Mapping[str, Any] | None = None,
) -> Scheduler:
    """The thinker on ``engine``: ``hf`` (omnictl's runner; text, images and audio, and the
    talker's hidden states) or ``vllm`` (text prompts only, no talker; the ``vllm`` mapping
    holds the engine knobs of :class:`~omnictl.schedulers.vllm_engine.VllmOptions`). See
    docs/engine.md. ``max_batch`` is the HF runner's; vLLM batches ``vllm.max_num_seqs``."""
    if engine not in ("hf", "vllm"):
        raise ValueError(f"factory_args.engine: must be 'hf' or 'vllm', got {engine!r}")
    if engine == "vllm":
        from omnictl.models.qwen3_omni.vllm_thinker import VllmThinkerScheduler
        from omnictl.schedulers.vllm_engine import VllmOptions, require_vllm

        require_vllm()  # first: the one error a machine without vLLM gets
        where = "cuda" if device is not None and device.startswith("cuda") else "cpu"
        options = VllmOptions.from_mapping({"device": where, **(vllm or {})})
        return VllmThinkerScheduler(model_path, options, stream_every=stream_every)
    if vllm is not None:
        raise ValueError("factory_args.vllm: engine options apply to engine: vllm only (engine is 'hf')")
    return ThinkerScheduler(ThinkerRunner(model_path, device), stream_every=stream_every, max_batch=max_batch)


def project_for_decode(data: TokenResult) -> TokenResult:
    """decode needs token ids and counts, not what the talker reads."""
    dropped: dict[str, Any] = {"hidden": None}
    if isinstance(data, ThinkerResult):  # the talker's prefix, when nothing streamed before
        dropped["talker_prefix"] = None
    return msgspec.structs.replace(data, **dropped)


def decode(model_path: str | Path | None = None) -> DecodeScheduler:
    return DecodeScheduler(model_path)


def talker_ar(
    model_path: str | Path | None = None,
    device: str | None = None,
    temperature: float = TALKER_SAMPLING["temperature"],
    top_k: int = TALKER_SAMPLING["top_k"],
    top_p: float = TALKER_SAMPLING["top_p"],
    max_codes: int = TALKER_SAMPLING["max_tokens"],
    repetition_penalty: float = 1.05,
    max_batch: int = 32,
    audio_policy: str = DEFAULT_POLICY,
    ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
) -> TalkerScheduler:
    """``audio_policy`` (``serve --audio-policy``): with ``deadline``, the batch's
    ``max_batch`` slots go to the streams nearest starvation, a codec frame counted as the
    80 ms of audio code2wav makes of it."""
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_tokens": max_codes}
    runner = TalkerRunner(model_path, device, repetition_penalty=repetition_penalty)
    return TalkerScheduler(
        runner, sampling=sampling, max_batch=max_batch, audio_policy=audio_policy, ttfp_target_s=ttfp_target_s
    )


def code2wav(
    model_path: str | Path | None = None,
    device: str | None = None,
    chunk_frames: int = 10,
    left_context: int = 25,
    first_chunk_frames: int = 2,
    audio_policy: str = DEFAULT_POLICY,
    ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
) -> Code2WavScheduler:
    return Code2WavScheduler(
        Vocoder(model_path, device, left_context=left_context),
        chunk_frames=chunk_frames,
        first_chunk_frames=first_chunk_frames,
        audio_policy=audio_policy,
        ttfp_target_s=ttfp_target_s,
    )
