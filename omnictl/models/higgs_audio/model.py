"""One Higgs Audio v2 model per checkpoint and device in a process."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import torch

_lock = threading.Lock()


def load_higgs(model_path: str | Path | None, device: str | None = None) -> Any:
    """``HiggsAudioV2ForConditionalGeneration`` from a local checkpoint, float32, eval mode."""
    if model_path is None:
        raise ValueError("factory_args.model_path: Higgs Audio needs a local checkpoint (serve --model PATH)")
    root = Path(model_path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(
            f"{root / 'config.json'}: no config.json (model_path must be a local Higgs Audio v2 checkpoint)"
        )
    with _lock:
        return _load(str(root.resolve()), device or "cpu")


@functools.lru_cache(maxsize=4)
def _load(root: str, device: str) -> Any:
    from transformers import HiggsAudioV2ForConditionalGeneration

    model: Any = HiggsAudioV2ForConditionalGeneration.from_pretrained(
        root, dtype=torch.float32
    )  # Any: transformers types .to() for its own wrapper
    return model.to(torch.device(device)).eval()
