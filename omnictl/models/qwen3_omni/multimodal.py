"""The front of Qwen3-Omni: preprocessing, the audio and image encoders, and their fan-in.

``Preprocessor`` turns a request (an :class:`omnictl.inputs.ChatRequest`, or the
``{"messages", "sampling", "voice"}`` dict) into token ids,
audio features and image patches, and keeps no raw media. The encoders each run one
tower of the thinker. ``merge_multimodal`` and ``Aggregator`` put the encoders' output
into the thinker's input embeddings at the placeholder tokens and compute the 3-D
(mrope) positions, exactly as ``Qwen3OmniMoeThinkerModel.forward`` does inside
``generate``; the thinker then starts from embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import AudioPart, ChatRequest, ImagePart, TextPart, as_chat_request, decode_audio, load_image
from omnictl.models.qwen3_omni.processor import load_processor
from omnictl.models.qwen3_omni.weights import check_model_path, load_thinker

AUDIO_RATE = 16_000  # the Whisper feature extractor's rate


class Preprocessor:
    """Chat template, audio features and image patches for one request.

    Qwen2.5-Omni's preprocessing is this one with its own processor (its prompt, features and
    patches are built by the same calls; see ``omnictl.models.qwen2_5_omni.stages``)."""

    model_name = "Qwen3-Omni"  # in the errors a request gets

    def __init__(self, model_path: str | Path | None) -> None:
        # Any: this family's processor here, Qwen2.5-Omni's in its subclass (called alike).
        self.processor: Any = load_processor(check_model_path(model_path))

    def __call__(self, data: ChatRequest | Mapping[str, Any]) -> dict[str, Any]:
        request = as_chat_request(data)  # audio arrives decoded; only resampled here
        if request.speed != 1.0:  # refused, not ignored: the talker has no duration control
            raise InvalidRequest(
                f"speed: {self.model_name}'s talker speaks at its own pace and cannot apply {request.speed:g}; send 1.0",
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


class AudioEncoder:
    """The thinker's audio tower: features -> one embedding per audio placeholder token."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.thinker = load_thinker(model_path, device)
        self.device = self.thinker.device

    @torch.inference_mode()
    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        if "input_features" not in data:
            return {}
        output = self.thinker.get_audio_features(
            data["input_features"].to(self.device), data["feature_attention_mask"].to(self.device)
        )
        return {"audio_embeds": output.last_hidden_state}


class ImageEncoder:
    """The thinker's vision tower: patches -> merged image embeddings plus deepstack features."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.thinker = load_thinker(model_path, device)
        self.device = self.thinker.device

    @torch.inference_mode()
    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        if "pixel_values" not in data:
            return {}
        grid = data["image_grid_thw"].to(self.device)
        output = self.thinker.get_image_features(data["pixel_values"].to(self.device), grid)
        deepstack = torch.stack([torch.cat(level, dim=0) for level in output.deepstack_features])
        return {"image_embeds": torch.cat(output.pooler_output, dim=0), "image_deepstack": deepstack}


_FROM_PREPROCESSING = ("input_ids", "attention_mask", "feature_attention_mask", "image_grid_thw", "voice")


def merge_multimodal(inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Fan-in for ``mm_aggregate``: token ids from preprocessing, embeddings from the encoders."""
    if "preprocessing" not in inputs:
        raise ValueError(f"merge_multimodal needs the preprocessing stage's output; got {sorted(inputs)}")
    front = inputs["preprocessing"]
    merged = {key: front[key] for key in _FROM_PREPROCESSING if key in front}
    for upstream in ("audio_encoder", "image_encoder"):
        merged.update(inputs.get(upstream) or {})
    return merged


class Aggregator:
    """Thinker input embeddings with the encoders' output scattered in, plus mrope positions."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.thinker = load_thinker(model_path, device)
        self.config = self.thinker.config
        self.device = self.thinker.device

    @torch.inference_mode()
    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        input_ids = data["input_ids"].to(self.device)
        attention_mask = data["attention_mask"].to(self.device)
        embeds = self.thinker.get_input_embeddings()(input_ids)
        audio_lengths = None
        if "audio_embeds" in data:
            audio_mask = (input_ids == self.config.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(audio_mask, data["audio_embeds"].to(self.device, embeds.dtype))
            audio_lengths = data["feature_attention_mask"].sum(dim=1).to(self.device)
        out: dict[str, Any] = {}
        grid = data.get("image_grid_thw")
        if "image_embeds" in data:
            image_mask = input_ids == self.config.image_token_id
            embeds = embeds.masked_scatter(image_mask.unsqueeze(-1), data["image_embeds"].to(self.device, embeds.dtype))
            out["visual_pos_masks"] = image_mask
            out["deepstack"] = data["image_deepstack"]
        grid = grid.to(self.device) if grid is not None else None
        mrope, rope_delta = self.thinker.get_rope_index(
            input_ids, grid, None, attention_mask, False, audio_lengths, None
        )
        text_positions = torch.arange(input_ids.shape[1], device=self.device).view(1, 1, -1)
        out.update(
            inputs_embeds=embeds[0],
            position_ids=torch.cat([text_positions, mrope.to(text_positions.dtype)], dim=0),
            rope_delta=int(rope_delta.reshape(-1)[0]),
            prompt_ids=input_ids[0],
        )
        # The talker's own 3-D positions need the media sizes too.
        if grid is not None:
            out["image_grid_thw"] = grid
        if audio_lengths is not None:
            out["audio_feature_lengths"] = audio_lengths
        if "voice" in data:
            out["voice"] = data["voice"]
        return out
