"""A tiny CSM checkpoint (written once per session) and transformers' greedy reference on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from omnictl.models.csm.tiny import write_tiny_checkpoint
from tests.models.conftest import one_thread

TEXT = "Hello there, how are you today?"
FRAMES = 12  # a random backbone rarely ends the audio by itself: bound it


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_csm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-csm"))


@pytest.fixture(scope="session")
def reference(tiny_csm: Path) -> dict[str, Any]:
    """transformers' ``CsmForConditionalGeneration.generate`` with do_sample=False: codes and audio."""
    import torch
    from transformers import AutoProcessor, CsmForConditionalGeneration

    processor = AutoProcessor.from_pretrained(tiny_csm)
    model = CsmForConditionalGeneration.from_pretrained(tiny_csm).eval()
    prompt = processor.apply_chat_template(
        [{"role": "0", "content": [{"type": "text", "text": TEXT}]}], tokenize=True, return_dict=True
    )
    with one_thread(), torch.inference_mode():
        out = model.generate(
            **prompt,
            max_new_tokens=FRAMES,
            do_sample=False,
            depth_decoder_do_sample=False,
            return_dict_in_generate=True,
            output_audio=True,
        )
    return {"codes": out.sequences[0], "audio": out.audio[0].numpy(), "input_ids": prompt["input_ids"]}
