"""Load the parts of a local Qwen3-ASR checkpoint that a stage process needs, once per process.

The audio encoder's process keeps the audio tower and the projector; the decoder's keeps
the Qwen3 decoder and its head. Each loads the whole checkpoint once and drops the other
half (the peak is at load time only). Nothing is downloaded: ``model_path`` must be a
checkpoint directory.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoProcessor, Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

from omnictl.exceptions import ModelPathError

_cache: dict[tuple[str, str, str], Any] = {}
_lock = threading.RLock()


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a Qwen3-ASR checkpoint."""
    if model_path is None:
        raise ModelPathError(
            "Qwen3-ASR stages need a local checkpoint directory (nothing is downloaded)",
            hint="pass --model-path DIR, or model_path= to Pipeline.launch",
        )
    path = Path(model_path).expanduser()
    hint = "write a tiny one with `python -m omnictl.models.qwen3_asr.tiny DIR`"
    if not (path / "config.json").is_file():
        raise ModelPathError(f"--model-path {str(path)!r} is not a checkpoint directory (no config.json)", hint=hint)
    return path


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


def _once(model_path: str | Path | None, part: str, device: str | None, build: Callable[[Path, str], Any]) -> Any:
    path = check_model_path(model_path)
    key = (str(path.resolve()), part, device or "cpu")
    with _lock:
        if key not in _cache:
            _cache[key] = build(path, key[2])
        return _cache[key]
