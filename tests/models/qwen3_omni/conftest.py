"""A tiny Qwen3-Omni checkpoint (written once per session) and request builders."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint
from tests.models.conftest import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-omni"))


def png_data_url(seed: int = 0, size: int = 64) -> str:
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size, size, 3) * 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def request(kind: str, *, max_tokens: int = 12, question: str = "What is the capital of France?") -> dict[str, Any]:
    """A greedy request with text only, or text plus one audio clip / one image."""
    content: list[dict[str, Any]] = [{"type": "text", "text": question}]
    if kind == "audio":
        noise = (np.random.RandomState(1).randn(16_000) * 0.1).astype(np.float32)
        content.append({"type": "input_audio", "input_audio": {"data": noise}})
    elif kind == "image":
        content.insert(0, {"type": "image_url", "image_url": {"url": png_data_url()}})
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content},
        ],
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
    }
