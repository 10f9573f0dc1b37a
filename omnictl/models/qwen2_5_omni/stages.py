"""Stage factories for the Qwen2.5-Omni topology (``topologies/qwen2.5-omni.yaml``).

preprocessing -> thinker -> {decode (text), talker -> token2wav (audio)}. Each factory takes
``model_path`` (a local checkpoint directory; nothing is downloaded) and ``device``. The
thinker encodes a prompt's audio and images itself (one forward of its towers at prefill).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import msgspec

from omnictl.inputs import ChatRequest
from omnictl.models.qwen2_5_omni.payloads import ThinkerDelta, ThinkerResult
from omnictl.models.qwen2_5_omni.processor import load_processor
from omnictl.models.qwen2_5_omni.talker import TalkerRunner
from omnictl.models.qwen2_5_omni.talker_scheduler import TalkerScheduler
from omnictl.models.qwen2_5_omni.thinker import ThinkerRunner, ThinkerScheduler
from omnictl.models.qwen2_5_omni.token2wav import Token2WavScheduler, token2wav_scheduler
from omnictl.models.qwen2_5_omni.weights import check_model_path
from omnictl.models.qwen3_omni.decode import DecodeScheduler
from omnictl.models.qwen3_omni.multimodal import Preprocessor as ChatPreprocessor
from omnictl.outputs import TokenResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S

# transformers' defaults for the talker in `Qwen2_5OmniForConditionalGeneration.generate`.
TALKER_SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "max_tokens": 4096}


class Preprocessor(ChatPreprocessor):
    """Qwen3-Omni's preprocessing with Qwen2.5-Omni's processor (the same template, audio features
    and image patches calls; its image processor has 14-pixel patches)."""

    model_name = "Qwen2.5-Omni"

    def __init__(self, model_path: str | Path | None) -> None:
        self.processor = load_processor(check_model_path(model_path))


def preprocessing(model_path: str | Path | None = None) -> Callable[[ChatRequest | Mapping[str, Any]], dict[str, Any]]:
    """The entry stage: takes the typed request (HTTP) or the request dict (Python API)."""
    return Preprocessor(model_path)


def thinker(
    model_path: str | Path | None = None, device: str | None = None, stream_every: int = 1, max_batch: int = 32
) -> ThinkerScheduler:
    return ThinkerScheduler(ThinkerRunner(model_path, device), stream_every=stream_every, max_batch=max_batch)


def project_for_decode(data: TokenResult) -> TokenResult:
    """decode needs token ids and counts, not the talker's rows."""
    if isinstance(data, (ThinkerDelta, ThinkerResult)):
        return msgspec.structs.replace(data, reply=None, talker_prefix=None)
    return data


def decode(model_path: str | Path | None = None) -> DecodeScheduler:
    """The text terminal: Qwen3-Omni's (the tokenizer is what differs, read from ``model_path``)."""
    return DecodeScheduler(model_path)


def talker(
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
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_tokens": max_codes}
    runner = TalkerRunner(model_path, device, repetition_penalty=repetition_penalty)
    return TalkerScheduler(
        runner, sampling=sampling, max_batch=max_batch, audio_policy=audio_policy, ttfp_target_s=ttfp_target_s
    )


def token2wav(
    model_path: str | Path | None = None,
    device: str | None = None,
    chunk_frames: int = 24,
    first_chunk_frames: int = 12,
    left_context: int = 24,
    noise_seed: int = 0,
    audio_policy: str = DEFAULT_POLICY,
    ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
) -> Token2WavScheduler:
    """``chunk_frames`` codes (20 ms each) per audio chunk after the first ``first_chunk_frames``;
    ``chunk_frames: 0`` decodes the whole answer at once, transformers' waveform exactly."""
    return token2wav_scheduler(
        model_path,
        device,
        chunk_frames=chunk_frames,
        first_chunk_frames=first_chunk_frames,
        left_context=left_context,
        noise_seed=noise_seed,
        audio_policy=audio_policy,
        ttfp_target_s=ttfp_target_s,
    )
