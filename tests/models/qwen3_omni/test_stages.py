"""Greedy staged Qwen3-Omni (in one process) against monolithic transformers `generate`.

Same tiny checkpoint, same processor output. Text must match token for token; the
talker's codec frames exactly; the waveform within float tolerance. The staged
vocoder decodes in chunks of 4 frames with left context while the monolithic one
decodes all frames at once (fewer than its 300-frame chunk), so the waveform is
compared with a tolerance rather than bit for bit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import parse_request
from omnictl.models.qwen3_omni import stages
from omnictl.models.qwen3_omni.payloads import TalkerResult
from omnictl.models.qwen3_omni.processor import load_processor
from omnictl.outputs import AudioChunk, AudioResult, FinishReason, TextDelta, TextResult, TokenResult
from omnictl.transports.packing import pack, unpack

from .chain import InProcessQwen
from .conftest import request

MAX_TOKENS = 12
MAX_CODES = 10


@pytest.fixture(scope="module")
def monolithic(tiny_qwen: Path) -> Qwen3OmniMoeForConditionalGeneration:
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_qwen).eval()


def reference(model: Any, tiny_qwen: Path, front: dict[str, Any]) -> tuple[list[int], torch.Tensor, np.ndarray]:
    """Monolithic text tokens, talker codes ([frames, groups]) and waveform."""
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def spy(codes: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        captured.append(codes.clone())
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = spy
    try:
        sequences, wav = model.generate(
            **{k: v for k, v in front.items() if k != "voice"},
            thinker_max_new_tokens=MAX_TOKENS,
            thinker_do_sample=False,
            thinker_eos_token_id=model.config.im_end_token_id,
            talker_max_new_tokens=MAX_CODES,
            talker_do_sample=False,
        )
    finally:
        del model.code2wav.chunked_decode
    generated = sequences[0, front["input_ids"].shape[1] :].tolist()
    return generated, captured[0][0].T, wav.reshape(-1).numpy()


@pytest.mark.slow  # the staged model and the monolithic one, generating side by side
@pytest.mark.parametrize("kind", ["text", "audio", "image"])
def test_staged_equals_monolithic(kind: str, tiny_qwen: Path, monolithic: Any) -> None:
    inputs = request(kind, max_tokens=MAX_TOKENS)

    async def staged() -> dict[str, Any]:
        async with InProcessQwen(str(tiny_qwen), talker_kwargs={"max_codes": MAX_CODES}, chunk_frames=4) as chain:
            return await chain.run(inputs, request_id=f"req-{kind}")

    out = asyncio.run(staged())
    front = stages.preprocessing(str(tiny_qwen))(inputs)
    tokens, codes, wav = reference(monolithic, tiny_qwen, front)

    # Text: token for token (the monolithic sequence ends at max_tokens here, no stop token).
    assert isinstance(out["thinker"], TokenResult)
    assert out["thinker"].token_ids == tokens
    tokenizer = load_processor(tiny_qwen).tokenizer
    decoded = out["decode"]
    assert isinstance(decoded, TextResult)
    assert decoded.text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert all(isinstance(chunk, TextDelta) for chunk in out["text_stream"])
    assert "".join(chunk.text for chunk in out["text_stream"]) == decoded.text
    assert decoded.completion_tokens == MAX_TOKENS and decoded.finish_reason is FinishReason.LENGTH
    # Audio: the same codec frames, and the same waveform, streamed in several chunks.
    assert isinstance(out["talker_ar"], TalkerResult)
    assert torch.equal(out["talker_ar"].codes, codes)
    assert len(out["audio_stream"]) >= 2
    assert all(isinstance(chunk, AudioChunk) and not isinstance(chunk, AudioResult) for chunk in out["audio_stream"])
    speech = out["code2wav"]
    assert isinstance(speech, AudioResult)
    streamed = np.concatenate([chunk.samples for chunk in out["audio_stream"]])
    np.testing.assert_array_equal(streamed, speech.samples)
    assert speech.samples.shape == wav.shape
    np.testing.assert_allclose(speech.samples, wav, atol=1e-5)


@pytest.mark.parametrize("kind", ["audio", "image"])
def test_preprocessing_takes_the_servers_typed_request_like_the_dict(kind: str, tiny_qwen: Path) -> None:
    inputs = request(kind)
    packed = pack(parse_request(inputs))  # as the HTTP server submits it, across a process hop
    arrived = unpack(packed.skeleton, packed.layout, packed.to_bytes())
    preprocess = stages.preprocessing(str(tiny_qwen))
    from_dict, from_typed = preprocess(inputs), preprocess(arrived)
    assert from_dict.keys() == from_typed.keys()
    for key, value in from_dict.items():
        assert torch.equal(value, from_typed[key]), key


def test_preprocessing_drops_raw_media(tiny_qwen: Path) -> None:
    front = stages.preprocessing(str(tiny_qwen))(request("audio"))
    assert set(front) == {"input_ids", "attention_mask", "input_features", "feature_attention_mask"}
    image_front = stages.preprocessing(str(tiny_qwen))(request("image"))
    assert set(image_front) == {"input_ids", "attention_mask", "pixel_values", "image_grid_thw"}


def test_preprocessing_refuses_a_speed_the_talker_cannot_apply_naming_it(tiny_qwen: Path) -> None:
    preprocess = stages.preprocessing(str(tiny_qwen))
    with pytest.raises(InvalidRequest, match="speed: .*cannot apply 1.25") as refused:
        preprocess({**request("text"), "speed": 1.25})
    assert refused.value.field == "speed"
    assert "input_ids" in preprocess({**request("text"), "speed": 1.0})  # the default passes


def test_merge_multimodal_needs_preprocessing() -> None:
    with pytest.raises(ValueError, match="preprocessing"):
        stages.merge_multimodal({"audio_encoder": {}})


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a Qwen3-Omni checkpoint"):
        stages.thinker(str(tmp_path), "cpu")
