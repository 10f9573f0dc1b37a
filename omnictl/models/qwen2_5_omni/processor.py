"""Load the Qwen2.5-Omni processor from a local checkpoint, without video support (as
Qwen3-Omni's: transformers' video processor needs torchvision, and requests carry text,
audio and images only)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, Qwen2_5OmniProcessor, Qwen2VLImageProcessorPil, WhisperFeatureExtractor

from omnictl.models.qwen3_omni.processor import WithoutVideo


class Qwen25OmniProcessorWithoutVideo(WithoutVideo, Qwen2_5OmniProcessor):
    """``Qwen2_5OmniProcessor`` that tolerates ``video_processor=None``."""


def load_processor(model_path: str | Path) -> Qwen25OmniProcessorWithoutVideo:
    """The processor saved in ``model_path`` (tokenizer, feature extractor, image processor, chat template)."""
    path = Path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return Qwen25OmniProcessorWithoutVideo(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor.from_pretrained(path, local_files_only=True),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
