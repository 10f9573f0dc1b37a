"""Higgs Audio v2's audio tokenizer (``transformers.HiggsAudioV2TokenizerModel``): codes to waveform.

The audio tokenizer turns 24 kHz audio into frames of 8 residual codes at 25 Hz (960
samples a frame) and back: its decoder looks up and sums each codebook's embedding,
projects it (``fc2``) and runs DAC's acoustic decoder, a stack of convolutions and
transposed convolutions that look both ways (it is not causal, unlike Mimi's).

transformers' module imports ``torchaudio`` at its top for one call, the 24 to 16 kHz
resampling in front of the semantic model when *encoding*; this install has no
torchaudio (``scripts/setup.sh`` removes it: its PyPI wheels do not load against the CPU
torch). :func:`audio_tokenizer_class` imports transformers' class anyway, with a
stand-in for that one module whose resampling refuses by name, so the decoder (all that
speaking needs) is transformers' own code, and encoding fails with a clear message. Without
torchaudio, ``transformers.HiggsAudioV2TokenizerModel`` is a placeholder that raises when
built; the class is put there in its place, so that ``HiggsAudioV2Processor`` (which checks
its audio tokenizer's class by that name) and ``AutoProcessor`` find it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

AUDIO_TOKENIZER_DIR = "audio_tokenizer"  # the codec's checkpoint, inside the model's directory
_MODULE = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"
_import_lock = threading.Lock()
_load_lock = threading.Lock()


def _no_resample(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError(
        "encoding audio with the Higgs Audio v2 tokenizer resamples it with torchaudio, which is not "
        "installed here (scripts/setup.sh removes it); decoding does not need it"
    )


@functools.cache
def audio_tokenizer_class() -> Any:
    """transformers' ``HiggsAudioV2TokenizerModel`` class, importable without torchaudio."""
    if _MODULE in sys.modules or importlib.util.find_spec("torchaudio") is not None:
        return importlib.import_module(_MODULE).HiggsAudioV2TokenizerModel
    # What the module imports besides, imported first: only its own code runs with the stand-in.
    import transformers.audio_utils
    import transformers.modeling_utils
    import transformers.models.auto
    import transformers.processing_utils

    with _import_lock:
        # The stand-in is in sys.modules only while transformers' module binds it: no other
        # import in this process sees a torchaudio.
        stand_in = types.ModuleType("torchaudio")
        stand_in.functional = types.SimpleNamespace(resample=_no_resample)  # type: ignore[attr-defined]  # the one name used
        sys.modules["torchaudio"] = stand_in
        try:
            module = importlib.import_module(_MODULE)
        finally:
            if sys.modules.get("torchaudio") is stand_in:
                del sys.modules["torchaudio"]
    cls = module.HiggsAudioV2TokenizerModel
    # Looked up now: importing transformers' model modules may put a new lazy
    # ``transformers`` module in sys.modules.
    transformers = sys.modules["transformers"]
    if getattr(getattr(transformers, cls.__name__), "is_dummy", False):
        setattr(transformers, cls.__name__, cls)
    return cls


def audio_tokenizer_path(model_path: str | Path, audio_tokenizer: str | Path | None = None) -> Path:
    """Where the audio tokenizer of the checkpoint at ``model_path`` is: ``audio_tokenizer``
    when given (the released model and its tokenizer are two repositories), else the
    ``audio_tokenizer/`` folder :mod:`omnictl.models.higgs_audio.tiny` writes beside the model."""
    path = Path(audio_tokenizer) if audio_tokenizer is not None else Path(model_path) / AUDIO_TOKENIZER_DIR
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path / 'config.json'}: no audio tokenizer there (write a checkpoint with "
            "`python -m omnictl.models.higgs_audio.tiny DIR`, or give factory_args.audio_tokenizer)"
        )
    return path


def load_audio_tokenizer(path: str | Path, device: str | None = None) -> Any:
    """The ``HiggsAudioV2TokenizerModel`` at ``path`` (eval mode, float32), on ``device``."""
    with _load_lock:
        return _load(str(Path(path).resolve()), device or "cpu")


@functools.lru_cache(maxsize=4)
def _load(path: str, device: str) -> Any:
    model = audio_tokenizer_class().from_pretrained(path, dtype=torch.float32)
    return model.to(torch.device(device)).eval()


class AudioTokenizer:
    """One Higgs Audio v2 audio tokenizer, decoding code frames to samples."""

    def __init__(self, path: str | Path, device: str | None = None) -> None:
        self.model = load_audio_tokenizer(path, device)
        config = self.model.config
        self.sample_rate = int(config.sample_rate)
        self.codebooks = int(config.num_quantizers)
        self.samples_per_frame = int(config.hop_length)
        self.device = next(self.model.parameters()).device

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """Float32 samples of code frames ``[frames, codebooks]`` (``samples_per_frame`` each),
        exactly what ``HiggsAudioV2TokenizerModel.decode`` gives for them."""
        frames = torch.as_tensor(codes, dtype=torch.long)
        if frames.ndim != 2 or frames.shape[1] != self.codebooks:
            raise ValueError(f"Higgs Audio frames must be [frames, {self.codebooks}], got {list(frames.shape)}")
        if frames.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.model.decode(frames.T[None].to(self.device)).audio_values
        return wav.reshape(-1).float().cpu().numpy()
