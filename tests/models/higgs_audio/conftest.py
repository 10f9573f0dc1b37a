"""A tiny Higgs Audio v2 checkpoint (written once per session) and transformers' greedy reference on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from omnictl.models.higgs_audio.tiny import SYSTEM_PROMPT, write_tiny_checkpoint
from tests.models.conftest import one_thread

TEXT = "Hello there, how are you today?"
FRAMES = 40  # bound: with seed 0 the model ends by itself after 27 frames (the end's delay ramp included)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


def turns(text: str = TEXT) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
        {"role": "user", "content": [{"type": "text", "text": text}]},
    ]


@pytest.fixture(scope="session")
def tiny_higgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-higgs"))


def generate(checkpoint: Path, max_new_tokens: int, text: str = TEXT) -> dict[str, Any]:
    """transformers' ``HiggsAudioV2ForConditionalGeneration.generate`` with do_sample=False,
    decoded by ``HiggsAudioV2Processor.decode`` (the audio tokenizer's own decode)."""
    import torch
    from transformers import AutoProcessor, HiggsAudioV2ForConditionalGeneration

    from omnictl.models.higgs_audio.codec import audio_tokenizer_class

    audio_tokenizer_class()  # transformers' class, where this install has no torchaudio
    processor = AutoProcessor.from_pretrained(checkpoint)
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(checkpoint).eval()
    prompt = processor.apply_chat_template(
        turns(text), tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt"
    )
    with one_thread(), torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True)
    frames = out.audio_sequences[0]
    codes = processor.revert_delay_pattern(frames[1 : _end(frames, model.config)]).clip(
        0, model.config.audio_stream_bos_id - 1
    )
    return {
        "input_ids": prompt["input_ids"],
        "tokens": out.sequences[0, prompt["input_ids"].shape[1] :].tolist(),
        "frames": frames,
        "codes": codes,
        "audio": _decode(processor, out.audio_sequences),
    }


def _decode(processor: Any, sequences: Any) -> Any:
    with one_thread():
        return processor.decode(sequences).numpy()


def _end(frames: Any, config: Any) -> int:
    ended = (frames == config.audio_stream_eos_id).all(-1).nonzero()
    return int(ended[0, 0]) if len(ended) else len(frames)


@pytest.fixture(scope="session")
def reference(tiny_higgs: Path) -> dict[str, Any]:
    return generate(tiny_higgs, FRAMES)
