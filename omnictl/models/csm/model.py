"""One CSM model per checkpoint and device in a process, shared by the stages that use it.

The backbone and the depth decoder stages run in one process (the frame loop between
them needs it, see :mod:`omnictl.models.csm.frames`); each needs its half of the same
``CsmForConditionalGeneration``, so it is loaded once, not once per stage.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import torch

_lock = threading.Lock()


def load_csm(model_path: str | Path | None, device: str | None = None) -> Any:
    """``CsmForConditionalGeneration`` from a local checkpoint, float32, eval mode, without its codec
    (the Mimi stages load their own)."""
    if model_path is None:
        raise ValueError("factory_args.model_path: CSM needs a local checkpoint (serve --model PATH)")
    root = Path(model_path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"{root / 'config.json'}: no config.json (model_path must be a local CSM checkpoint)")
    with _lock:
        return _load(str(root.resolve()), device or "cpu")


@functools.lru_cache(maxsize=4)
def _load(root: str, device: str) -> Any:
    from transformers import CsmForConditionalGeneration

    model = CsmForConditionalGeneration.from_pretrained(root, dtype=torch.float32)
    model.codec_model = None  # the Mimi decoder stage holds the codec
    return model.to(torch.device(device)).eval()
