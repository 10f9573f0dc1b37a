"""A tiny Moshi checkpoint (its Mimi is the codec under test), written once per session, and audio for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnictl.models.moshi.tiny import SAMPLE_RATE, write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_moshi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moshi"))


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Tones that come and go (a syllable's rate) over noise: random weights hear anything, and
    a signal that changes keeps every codebook busy."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    pitch = 140 + 60 * np.sin(2 * np.pi * 0.25 * t)
    voice = 0.3 * envelope * np.sin(2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE)
    return (voice + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
