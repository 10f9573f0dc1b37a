"""The ``hear`` stage of ``hearing.yaml``: a recognizer double that says what audio reached
it ("heard N samples at 16 kHz, peak P"), so a test can tell whose audio it was."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from omnictl.outputs import Transcript

RATE = 16_000  # preprocessing resamples every spoken part to this


def describe(samples: np.ndarray) -> str:
    peak = float(np.abs(samples).max()) if samples.size else 0.0
    return f"heard {samples.size} samples at {RATE} Hz, peak {peak:.2f}"


def hear() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        samples = np.concatenate([np.asarray(a, dtype=np.float32) for a in data["audio"].values()])
        text = describe(samples)
        return {"messages": [{"role": "user", "content": text}],
                "transcript": Transcript(text=text, duration=samples.size / RATE)}

    return run
