"""Qwen2.5-Omni's preprocessing: Qwen3-Omni's Preprocessor with Qwen2.5-Omni's processor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.models.qwen2_5_omni import stages
from omnictl.models.qwen2_5_omni.processor import load_processor

from .conftest import request


def test_preprocessing_is_the_qwen2_5_processor_on_the_chat_template(tiny_qwen25: Path) -> None:
    front = stages.preprocessing(str(tiny_qwen25))(request("audio"))
    processor = load_processor(tiny_qwen25)
    body = request("audio")
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": body["messages"][0]["content"]}]},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}, {"type": "audio"}]},
    ]
    prompt = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    audio = body["messages"][1]["content"][1]["input_audio"]["data"]
    expected = processor(text=[prompt], audio=[audio], return_tensors="pt")
    assert set(front) == {"input_ids", "attention_mask", "input_features", "feature_attention_mask"}
    for key, value in front.items():
        assert torch.equal(value, expected[key]), key


def test_a_speed_the_talker_cannot_apply_is_refused_naming_qwen2_5_omni(tiny_qwen25: Path) -> None:
    with pytest.raises(InvalidRequest, match="speed: Qwen2.5-Omni's talker .* cannot apply 1.25") as refused:
        stages.preprocessing(str(tiny_qwen25))({**request("text"), "speed": 1.25})
    assert refused.value.field == "speed"
