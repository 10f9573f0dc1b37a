"""Load a local Qwen3-Omni checkpoint once per process and per device.

Stages that share a process (the frontend's encoders and aggregator) share one copy.
Nothing is downloaded: ``model_path`` must be a checkpoint directory.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

_models: dict[tuple[str, str], Qwen3OmniMoeForConditionalGeneration] = {}
_lock = threading.Lock()


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a checkpoint."""
    if model_path is None:
        raise ValueError("Qwen3-Omni stages need model_path: a local checkpoint directory (nothing is downloaded)")
    path = Path(model_path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model_path {str(path)!r} is not a Qwen3-Omni checkpoint directory (no config.json); "
            "write a tiny one with `python -m omnictl.models.qwen3_omni.tiny DIR`"
        )
    return path


def load_model(model_path: str | Path | None, device: str | None = None) -> Qwen3OmniMoeForConditionalGeneration:
    """The whole model in eval mode on ``device`` (default cpu), loaded once per process."""
    path = check_model_path(model_path)
    key = (str(path.resolve()), device or "cpu")
    with _lock:
        model = _models.get(key)
        if model is None:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                path, dtype=torch.float32, local_files_only=True
            )
            model = model.to(key[1]).eval()
            _models[key] = model
    return model
