"""Mimi (kyutai's neural audio codec, ``transformers.MimiModel``), loaded from any checkpoint that holds one.

Mimi turns 24 kHz audio into frames of residual codes at 12.5 Hz (1,920 samples a frame)
and back. CSM speaks through it and Moshi listens and speaks through it, so the codec is
one package any family uses: :func:`load_mimi` finds the codec inside a CSM checkpoint
(``codec_model.*``), a Moshi checkpoint (``audio_encoder.*``) or a Mimi checkpoint of its
own, and builds only the codec from those weights (not the language models around it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

# model_type of the checkpoint -> (its transformers class, the attribute holding its Mimi)
_EMBEDDED = {
    "csm": ("CsmForConditionalGeneration", "codec_model"),
    "moshi": ("MoshiForConditionalGeneration", "audio_encoder"),
}


def load_mimi(model_path: str | Path, device: str | None = None) -> Any:
    """The ``MimiModel`` in ``model_path`` (eval mode, float32), on ``device``.

    Raises FileNotFoundError naming the missing file and ValueError naming an
    architecture with no Mimi in it. A codec inside a CSM or Moshi checkpoint is taken
    from the whole model loaded by its transformers class (whose loader maps the stored
    weight names onto the current layout); the rest is freed at once."""
    import transformers

    root = Path(model_path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: no config.json (model_path must be a local checkpoint directory)")
    model_type = json.loads(config_file.read_text()).get("model_type")
    codec: Any  # transformers types .to() for its own wrapper, not the model
    if model_type == "mimi":
        codec = transformers.MimiModel.from_pretrained(root, dtype=torch.float32)
    elif model_type in _EMBEDDED:
        class_name, attribute = _EMBEDDED[model_type]
        whole = getattr(transformers, class_name).from_pretrained(root, dtype=torch.float32)
        codec = getattr(whole, attribute)
        del whole
    else:
        raise ValueError(
            f"{config_file}: model_type {model_type!r} holds no Mimi codec (expected one of mimi, {', '.join(_EMBEDDED)})"
        )
    return codec.to(torch.device(device or "cpu")).eval()


class MimiCodec:
    """One Mimi model and the two things stages do with it: encode audio, decode code frames."""

    def __init__(self, model_path: str | Path, device: str | None = None) -> None:
        self.model = load_mimi(model_path, device)
        config = self.model.config
        self.sample_rate = int(config.sampling_rate)
        self.codebooks = int(config.num_quantizers)
        self.samples_per_frame = int(round(config.sampling_rate / config.frame_rate))
        self.device = next(self.model.parameters()).device

    @torch.inference_mode()
    def encode(self, samples: np.ndarray) -> torch.Tensor:
        """Codes ``[frames, codebooks]`` (int64, on CPU) of mono float samples at :attr:`sample_rate`."""
        audio = torch.as_tensor(np.asarray(samples, dtype=np.float32)).reshape(1, 1, -1).to(self.device)
        return self.model.encode(audio).audio_codes[0].T.contiguous().cpu()

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """Float32 samples of code frames ``[frames, codebooks]`` (``samples_per_frame`` each)."""
        frames = torch.as_tensor(codes, dtype=torch.long)
        if frames.ndim != 2 or frames.shape[1] != self.codebooks:
            raise ValueError(f"Mimi frames must be [frames, {self.codebooks}], got {list(frames.shape)}")
        if frames.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.model.decode(frames.T[None].to(self.device)).audio_values
        return wav.reshape(-1).float().cpu().numpy()


def codec_codebooks(model_path: str | Path) -> int:
    """How many of Mimi's codebooks the checkpoint's model speaks and listens in: a Moshi
    checkpoint's ``num_codebooks`` (8 of the released Mimi's 32), else every one Mimi has."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("model_type") == "moshi":
        return int(config["num_codebooks"])
    if config.get("model_type") == "csm":
        return int(config["num_codebooks"])
    return int(config["num_quantizers"])
