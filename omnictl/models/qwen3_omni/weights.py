"""Load the parts of a local Qwen3-Omni checkpoint that a stage process needs, once per process.

The frontend and the thinker load the thinker only; the talker process keeps the
talker, the vocoder and the thinker's token embedding table (the talker re-embeds the
thinker's tokens). Nothing is downloaded: ``model_path`` must be a checkpoint directory.
"""

from __future__ import annotations

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

from omnictl.models import tensor_parallel
from omnictl.models.checkpoint_parts import CheckpointParts, checkpoint_dir


@dataclass(frozen=True)
class TalkerParts:
    config: Qwen3OmniMoeConfig
    talker: Qwen3OmniMoeTalkerForConditionalGeneration
    thinker_embed: torch.nn.Embedding


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a checkpoint."""
    return checkpoint_dir(model_path, model="Qwen3-Omni", flag="--model-path", writer="omnictl.models.qwen3_omni.tiny")


_parts = CheckpointParts(check_model_path)
_once = _parts.once


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
