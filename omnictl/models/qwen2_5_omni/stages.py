"""Stage factories for the Qwen2.5-Omni topology (``topologies/qwen2.5-omni.yaml``).

preprocessing -> thinker -> {decode (text), talker -> token2wav (audio)}. Each factory takes
``model_path`` (a local checkpoint directory; nothing is downloaded) and ``device``. The
thinker encodes a prompt's audio and images itself (one forward of its towers at prefill).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import msgspec

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import AudioPart, ChatRequest, ImagePart, TextPart, as_chat_request, decode_audio, load_image
from omnictl.models.qwen2_5_omni.payloads import ThinkerDelta, ThinkerResult
from omnictl.models.qwen2_5_omni.processor import load_processor
from omnictl.models.qwen2_5_omni.talker import TalkerRunner
from omnictl.models.qwen2_5_omni.talker_scheduler import TalkerScheduler
from omnictl.models.qwen2_5_omni.thinker import ThinkerRunner, ThinkerScheduler
from omnictl.models.qwen2_5_omni.token2wav import Token2WavScheduler, token2wav_scheduler
from omnictl.models.qwen2_5_omni.weights import check_model_path
from omnictl.models.qwen3_omni.decode import DecodeScheduler
from omnictl.outputs import TokenResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S

AUDIO_RATE = 16_000  # the Whisper feature extractor's rate
# transformers' defaults for the talker in `Qwen2_5OmniForConditionalGeneration.generate`.
TALKER_SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "max_tokens": 4096}


class Preprocessor:
    """Chat template, audio features and image patches for one request."""

    def __init__(self, model_path: str | Path | None) -> None:
        self.processor = load_processor(check_model_path(model_path))

    def __call__(self, data: ChatRequest | Mapping[str, Any]) -> dict[str, Any]:
        request = as_chat_request(data)  # audio arrives decoded; only resampled here
        if request.speed != 1.0:  # refused, not ignored: the talker has no duration control
            raise InvalidRequest(
                f"speed: Qwen2.5-Omni's talker speaks at its own pace and cannot apply {request.speed:g}; send 1.0",
                field="speed",
            )
        conversation: list[dict[str, Any]] = []
        audios: list[Any] = []
        images: list[Any] = []
        for message in request.messages:
            content: list[dict[str, Any]] = []
            for part in message.parts:
                if isinstance(part, TextPart):
                    content.append({"type": "text", "text": part.text})
                elif isinstance(part, AudioPart):
                    content.append({"type": "audio"})
                    audios.append(decode_audio(part, AUDIO_RATE))
                elif isinstance(part, ImagePart):
                    content.append({"type": "image"})
                    images.append(load_image(part))
            conversation.append({"role": message.role, "content": content})
        prompt = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        features = self.processor(text=[prompt], audio=audios or None, images=images or None, return_tensors="pt")
        # Only model inputs leave this stage: the decoded audio and images stay behind.
        out: dict[str, Any] = {"input_ids": features["input_ids"], "attention_mask": features["attention_mask"]}
        for key in ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw"):
            if key in features:
                out[key] = features[key]
        if request.voice is not None:
            out["voice"] = request.voice
        return out


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
