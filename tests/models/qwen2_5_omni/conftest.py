"""A tiny Qwen2.5-Omni checkpoint (written once per session), request builders and
transformers' greedy reference on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from omnictl.models.qwen2_5_omni.tiny import write_tiny_checkpoint
from tests.models.conftest import one_thread

MAX_TOKENS = 10
MAX_CODES = 16  # a random talker rarely says end-of-speech: bound the audio
NOISE_SEED = 0  # token2wav's noise_seed default


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_qwen25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2.5-omni"))


def request(kind: str, *, max_tokens: int = MAX_TOKENS, voice: str | None = None) -> dict[str, Any]:
    """A greedy request with text only, or text plus one audio clip."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is the capital of France?"}]
    if kind == "audio":
        noise = (np.random.RandomState(1).randn(16_000) * 0.1).astype(np.float32)
        content.append({"type": "input_audio", "input_audio": {"data": noise}})
    body: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content},
        ],
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
    }
    if voice is not None:
        body["voice"] = voice
    return body


class Reference:
    """``Qwen2_5OmniForConditionalGeneration.generate``, greedy, on the tiny checkpoint."""

    def __init__(self, path: Path) -> None:
        from transformers import Qwen2_5OmniForConditionalGeneration

        from omnictl.models.qwen2_5_omni import stages

        self.model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path).eval()
        self.preprocess = stages.preprocessing(str(path))

    def generate(self, inputs: dict[str, Any], *, max_codes: int = MAX_CODES) -> dict[str, Any]:
        """Text tokens, the codes token2wav decoded, and the waveform."""
        front = self.preprocess(inputs)
        voice = front.pop("voice", "Chelsie")
        captured: list[torch.Tensor] = []
        token2wav = self.model.token2wav
        forward = token2wav.forward

        def spy(code: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            captured.append(code.clone())
            return forward(code, *args, **kwargs)

        talker = self.model.config.talker_config
        token2wav.forward = spy
        try:
            with one_thread():
                torch.manual_seed(NOISE_SEED)  # token2wav's noise: the first draw after the seed
                sequences, wav = self.model.generate(
                    **front,
                    speaker=voice,
                    thinker_max_new_tokens=inputs["sampling"]["max_tokens"],
                    thinker_do_sample=False,
                    thinker_eos_token_id=self.preprocess.processor.tokenizer.convert_tokens_to_ids("<|im_end|>"),
                    talker_max_new_tokens=max_codes,
                    talker_do_sample=False,
                    talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
                )
        finally:
            del token2wav.forward
        return {
            "tokens": sequences[0, front["input_ids"].shape[1] :].tolist(),
            "codes": captured[0][0].tolist(),
            "wav": wav.reshape(-1).numpy(),
        }


@pytest.fixture(scope="session")
def reference(tiny_qwen25: Path) -> Reference:
    return Reference(tiny_qwen25)
