"""Load the Qwen3-Omni processor from a local checkpoint, without video support.

transformers' video processor needs torchvision, which a CPU-only install does
not have; our request format carries text, audio and images only. So the
processor is assembled from its three other parts, and a missing video processor
is accepted instead of failing the whole processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import (
    AutoTokenizer,
    Qwen2VLImageProcessorPil,
    Qwen3OmniMoeProcessor,
    WhisperFeatureExtractor,
)


class WithoutVideo:
    """Mixin for a Qwen-Omni processor class (Qwen3-Omni's, Qwen2.5-Omni's): tolerates
    ``video_processor=None`` and names the model inputs of the three other parts only."""

    tokenizer: Any
    feature_extractor: Any
    image_processor: Any

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)  # type: ignore[misc]  # the processor class after it

    @property
    def model_input_names(self) -> list[str]:
        names = (
            list(self.tokenizer.model_input_names)
            + list(self.feature_extractor.model_input_names)
            + list(self.image_processor.model_input_names)
            + ["feature_attention_mask"]
        )
        return list(dict.fromkeys(names))


class Qwen3OmniProcessorWithoutVideo(WithoutVideo, Qwen3OmniMoeProcessor):
    """``Qwen3OmniMoeProcessor`` that tolerates ``video_processor=None``."""


def load_processor(model_path: str | Path) -> Qwen3OmniProcessorWithoutVideo:
    """The processor saved in ``model_path`` (tokenizer, feature extractor, image processor, chat template)."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"Qwen3-Omni checkpoint directory not found: {path}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    feature_extractor = WhisperFeatureExtractor.from_pretrained(path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    return Qwen3OmniProcessorWithoutVideo(
        image_processor=image_processor,
        video_processor=None,
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
