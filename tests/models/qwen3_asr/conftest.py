"""A tiny Qwen3-ASR checkpoint (written once per session), clips, and transformers' own answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnictl.models.qwen3_asr.tiny import SAMPLE_RATE, write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_asr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-asr"))


def clip(seed: int = 1, seconds: float = 1.5) -> np.ndarray:
    """Noise with a tone in it: random weights hear anything, and each clip differently."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.RandomState(seed).randn(t.size) * 0.05
    return (noise + 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)).astype(np.float32)


def request(audio: np.ndarray, *, max_tokens: int = 12, language: str | None = None, **extra: Any) -> dict[str, Any]:
    """The Python API's request: one user message holding the clip, greedy."""
    part = {"type": "input_audio", "input_audio": {"data": audio, "sample_rate": SAMPLE_RATE}}
    inputs: dict[str, Any] = {
        "messages": [{"role": "user", "content": [part]}],
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
        **extra,
    }
    if language is not None:
        inputs["language"] = language
    return inputs


class Reference:
    """transformers' processor and model on the same checkpoint, loaded once."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(path)
        self.model = Qwen3ASRForConditionalGeneration.from_pretrained(path).eval()
        self.stop = set(self.model.generation_config.eos_token_id)

    def inputs(self, audio: np.ndarray, language: str | None = None, prompt: str | None = None) -> Any:
        return self.processor.apply_transcription_request(audio, language=language, prompt=prompt)

    def generate(
        self, audio: np.ndarray, *, max_tokens: int, language: str | None = None, prompt: str | None = None
    ) -> tuple[list[int], dict[str, Any]]:
        """Greedy ``generate``: the new token ids (an end token left out, as omnictl's) and
        the processor's reading of them (language, transcription)."""
        inputs = self.inputs(audio, language, prompt)
        out = self.model.generate(**inputs, do_sample=False, max_new_tokens=max_tokens)
        ids = out[0, inputs["input_ids"].shape[1] :].tolist()
        if ids and ids[-1] in self.stop:
            ids = ids[:-1]
        return ids, self.processor.decode(ids, return_format="parsed")


@pytest.fixture(scope="session")
def reference(tiny_asr: Path) -> Reference:
    return Reference(tiny_asr)
