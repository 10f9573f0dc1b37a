"""Load the parts of a local Qwen3-Omni checkpoint that a stage process needs, once per process.

The frontend and the thinker load the thinker only; the talker process keeps the
talker, the vocoder and the thinker's token embedding table (the talker re-embeds the
thinker's tokens). Nothing is downloaded: ``model_path`` must be a checkpoint directory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from omnictl.exceptions import ModelPathError
from omnictl.models import tensor_parallel

_cache: dict[tuple[str, str, str], Any] = {}
_lock = threading.RLock()  # building one part may load another (the config)


@dataclass(frozen=True)
class TalkerParts:
    config: Qwen3OmniMoeConfig
    talker: Qwen3OmniMoeTalkerForConditionalGeneration
    thinker_embed: torch.nn.Embedding


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a checkpoint."""
    if model_path is None:
        raise ModelPathError(
            "Qwen3-Omni stages need a local checkpoint directory (nothing is downloaded)",
            hint="pass --model-path DIR, or model_path= to Pipeline.launch",
        )
    path = Path(model_path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelPathError(
            f"--model-path {str(path)!r} is not a Qwen3-Omni checkpoint directory (no config.json)",
            hint="write a tiny one with `python -m omnictl.models.qwen3_omni.tiny DIR`",
        )
    return path


def load_config(model_path: str | Path | None) -> Qwen3OmniMoeConfig:
    return _once(model_path, "config", "-", lambda path, _: Qwen3OmniMoeConfig.from_pretrained(path))


def load_thinker(
    model_path: str | Path | None, device: str | None = None
) -> Qwen3OmniMoeThinkerForConditionalGeneration:
    def build(path: Path, device: str) -> Any:
        # In a tensor-parallel group: this rank's shard (the thinker's text model has a plan).
        shard = tensor_parallel.load_kwargs(load_config(path).thinker_config)
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, local_files_only=True, **shard
        )
        return thinker.to(device).eval()

    return _once(model_path, "thinker", device, build)


def load_talker(model_path: str | Path | None, device: str | None = None) -> TalkerParts:
    return _talker_side(model_path, device)[0]


def load_code2wav(model_path: str | Path | None, device: str | None = None) -> Qwen3OmniMoeCode2Wav:
    return _talker_side(model_path, device)[1]


def _talker_side(model_path: str | Path | None, device: str | None) -> tuple[TalkerParts, Qwen3OmniMoeCode2Wav]:
    def build(path: Path, device: str) -> tuple[TalkerParts, Qwen3OmniMoeCode2Wav]:
        # The whole model is loaded (transformers converts the stored expert layout), then the
        # thinker is dropped but for its embedding table: the peak is at load time only.
        full = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        embed = full.thinker.get_input_embeddings()
        talker, code2wav = full.talker, full.code2wav
        del full.thinker
        parts = TalkerParts(full.config, talker.to(device).eval(), embed.to(device).eval())
        return parts, code2wav.to(device).eval()

    return _once(model_path, "talker-side", device, build)


def _once(model_path: str | Path | None, part: str, device: str | None, build: Any) -> Any:
    path = check_model_path(model_path)
    key = (str(path.resolve()), part, device or "cpu")
    with _lock:
        if key not in _cache:
            _cache[key] = build(path, key[2])
        return _cache[key]
