"""Load the parts of a local Qwen3-ASR checkpoint that a stage process needs, once per process.

The audio encoder's process keeps the audio tower and the projector; the decoder's keeps
the Qwen3 decoder and its head. Each loads the whole checkpoint once and drops the other
half (the peak is at load time only). Nothing is downloaded: ``model_path`` must be a
checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoProcessor, Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

from omnictl.exceptions import ModelPathError
from omnictl.models.checkpoint_parts import CheckpointParts, checkpoint_dir


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a Qwen3-ASR checkpoint."""
    return checkpoint_dir(model_path, model="Qwen3-ASR", flag="--model-path", writer="omnictl.models.qwen3_asr.tiny")


_parts = CheckpointParts(check_model_path)
_once = _parts.once


def load_config(model_path: str | Path | None) -> Qwen3ASRConfig:
    def build(path: Path, _: str) -> Qwen3ASRConfig:
        config = Qwen3ASRConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != "qwen3_asr":
            raise ModelPathError(
                f"--model-path {str(path)!r} holds a {config.model_type!r} model, not Qwen3-ASR (model_type 'qwen3_asr')"
            )
        return config

    return _once(model_path, "config", "-", build)


def load_processor(model_path: str | Path | None) -> Any:
    """The checkpoint's ``Qwen3ASRProcessor`` (feature extractor, tokenizer, chat template)."""
    return _once(
        model_path, "processor", "-", lambda path, _: AutoProcessor.from_pretrained(path, local_files_only=True)
    )


def load_encoder(model_path: str | Path | None, device: str | None = None) -> Any:
    """The audio tower with the projector: ``Qwen3ASRModel`` less its decoder."""
    return _once(model_path, "encoder", device, lambda path, device: _half(path, device, keep="encoder"))


def load_decoder(model_path: str | Path | None, device: str | None = None) -> Qwen3ASRForConditionalGeneration:
    """The model less its audio tower: the decoder, its token embedding table and the LM head."""
    return _once(model_path, "decoder", device, lambda path, device: _half(path, device, keep="decoder"))


def _half(path: Path, device: str, keep: str) -> Any:
    load_config(path)  # a clear error for another model's checkpoint
    # Any: transformers hides `from_pretrained`'s and `to`'s return types behind decorators.
    full: Any = Qwen3ASRForConditionalGeneration.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    if keep == "encoder":
        inner = full.model
        del inner.language_model
        return inner.to(device).eval()
    del full.model.audio_tower
    del full.model.multi_modal_projector
    return full.to(device).eval()
