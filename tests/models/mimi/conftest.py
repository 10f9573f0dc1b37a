"""Audio for the tiny Moshi checkpoint (its Mimi is the codec under test; the checkpoint is
``tiny_moshi``, tests/models/conftest.py: written once per session, shared with tests/models/moshi)."""

from __future__ import annotations

import numpy as np

from omnictl.models.moshi.tiny import SAMPLE_RATE


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Tones that come and go (a syllable's rate) over noise: random weights hear anything, and
    a signal that changes keeps every codebook busy."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    pitch = 140 + 60 * np.sin(2 * np.pi * 0.25 * t)
    voice = 0.3 * envelope * np.sin(2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE)
    return (voice + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
