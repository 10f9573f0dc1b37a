"""Load the parts of a local Qwen2.5-Omni checkpoint that a stage process needs, once per process.

The thinker's process keeps the thinker (its towers included: the thinker stage encodes
a prompt's audio and images itself). The talker's process keeps the talker, the thinker's
token embedding table (the talker embeds its text start, end and pad tokens), token2wav
and the speakers of ``spk_dict.pt``. Nothing is downloaded: ``model_path`` must be a
checkpoint directory (``python -m omnictl.models.qwen2_5_omni.tiny DIR`` writes a small one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    Qwen2_5OmniTalkerForConditionalGeneration,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2_5OmniToken2WavModel,
)

from omnictl.models.checkpoint_parts import CheckpointParts, checkpoint_dir


@dataclass(frozen=True)
class TalkerParts:
    config: Qwen2_5OmniConfig
    talker: Qwen2_5OmniTalkerForConditionalGeneration
    thinker_embed: torch.nn.Embedding
    token2wav: Qwen2_5OmniToken2WavModel
    speakers: dict[str, dict[str, Any]]  # spk_dict.pt: name -> bos_token, cond, ref_mel


def check_model_path(model_path: str | Path | None) -> Path:
    """``model_path`` as a Path, or a clear error when it is missing or not a checkpoint."""
    return checkpoint_dir(
        model_path,
        model="Qwen2.5-Omni",
        flag="--model",
        writer="omnictl.models.qwen2_5_omni.tiny",
        required=("config.json", "spk_dict.pt"),
    )


_parts = CheckpointParts(check_model_path)
_once = _parts.once


def load_config(model_path: str | Path | None) -> Qwen2_5OmniConfig:
    return _once(model_path, "config", "-", lambda path, _: Qwen2_5OmniConfig.from_pretrained(path))


def load_thinker(
    model_path: str | Path | None, device: str | None = None
) -> Qwen2_5OmniThinkerForConditionalGeneration:
    def build(path: Path, device: str) -> Any:
        thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        )
        return thinker.to(device).eval()

    return _once(model_path, "thinker", device, build)


def load_talker(model_path: str | Path | None, device: str | None = None) -> TalkerParts:
    def build(path: Path, device: str) -> TalkerParts:
        # The whole model (it also reads spk_dict.pt), then the thinker is dropped but for
        # its embedding table: the peak is at load time only.
        full = Qwen2_5OmniForConditionalGeneration.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        embed = full.thinker.get_input_embeddings()
        del full.thinker
        return TalkerParts(
            config=full.config,
            talker=full.talker.to(device).eval(),
            thinker_embed=embed.to(device).eval(),
            token2wav=full.token2wav.float().to(device).eval(),
            speakers=dict(full.speaker_map),
        )

    return _once(model_path, "talker-side", device, build)
